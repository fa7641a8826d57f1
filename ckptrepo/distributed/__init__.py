"""Distributed commits and loads through ``torch.distributed.checkpoint`` (DCP).

``writer.ShareWriter`` is a DCP ``StorageWriter``: every rank writes its share of the state's
chunks into packs (``CommitWriter.write_packs``), the coordinator's ``finish`` records one
commit (``merge`` assembles the tensors from the ranks' pieces). ``reader.CommitReader`` is a
DCP ``StorageReader`` that serves a load plan by reading only the chunks each rank's shards
need. ``native`` runs ``Repo.commit`` and ``Repo.checkout(into=...)`` on every rank of a
process group through the same two; ``scope`` decides when they do (under a process group of
two or more ranks, for DTensors, or with ``group=``; not with ``local=True``) and stores a DDP
module as the module it wraps; ``keys`` gives optimizer state dicts back the int keys DCP's string
key paths took. ``layout`` is the arithmetic of shards and bytes.
"""
