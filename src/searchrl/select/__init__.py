"""`searchrl data select`: difficulty-based data selection (docs/guides/data-selection.md;
R1-Searcher §4.1), a rollout job: a reference model samples rollouts of each question until one
is right, and the count sorts the questions into easy, medium, difficult and unsolved (`run`,
its config `config`, the buckets `buckets`, its report `report`)."""
