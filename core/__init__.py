"""What serving (app/), the index build (index/) and the offline pipeline (models/) share.

Torch-free, and it imports nothing of ours outside core/ (tests/test_layers.py): the bundle
format and the encoder runtime, text normalisation, the index formats (versioned store,
candidate records, FAISS structures), the bundle's numpy heads (poly rerank, reactions,
confidence) and the retrieval strategies that serving runs and `models/walk.py` replays.
"""
