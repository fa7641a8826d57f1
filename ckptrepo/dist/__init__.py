"""Distributed commits and loads through ``torch.distributed.checkpoint`` (DCP).

``writer.ShareWriter`` is a DCP ``StorageWriter``: every rank writes its share of the state's
chunks into packs (``CommitWriter.write_packs``), the coordinator's ``finish`` records one
commit (``merge`` assembles the tensors from the ranks' pieces). ``reader.CommitReader`` is a
DCP ``StorageReader`` that serves a load plan by reading only the chunks each rank's shards
need. ``native`` runs ``Repo.commit`` and ``Repo.checkout(into=...)`` on every rank of a
process group through the same two. ``layout`` is the arithmetic of shards and bytes.
"""
