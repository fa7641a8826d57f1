"""Integrations with training frameworks, each an optional extra (its framework is imported only by its module).

- ``ckptrepo.integrations.transformers``: ``RepoCallback`` for the Hugging Face ``Trainer``;
- ``ckptrepo.integrations.lightning``: ``RepoCheckpoint``, a PyTorch Lightning callback.
"""
