"""Tools the policy may call (search, open, calculate, users' own): see `searchrl.tools.base`."""
