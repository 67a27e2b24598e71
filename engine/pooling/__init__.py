"""Pooling engines: embeddings (:mod:`.embeddings`) and cross-encoder scores (:mod:`.scoring`)
on the same shared engine, registry and loop thread as the chat engines."""
