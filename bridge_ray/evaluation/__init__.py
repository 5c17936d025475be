"""Evaluation: run the agent greedily on QA files and report the paper's table (EM, F1, cover-EM, recall)."""
