"""QA data sets (FlashRAG jsonl, Search-R1 parquet) and the bundled synthetic knowledge world."""
