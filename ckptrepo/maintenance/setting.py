"""The repository's stored retention setting: rules that apply by themselves after commits.

Stored in ``repo_meta`` under the key ``retention`` as the JSON of ``RetentionRules.to_json``
(no row: no setting), and journaled (``ledger.journal``: ``{"op": "retention", "rules": ...}``)
durably before the transaction that changes it, taken back if that transaction fails.
"""

from __future__ import annotations

import json

from sqlalchemy import delete, select
from sqlalchemy.orm import Session, sessionmaker

from ckptrepo.db import catalog
from ckptrepo.db.engine import write_transaction
from ckptrepo.db.models import RepoMeta
from ckptrepo.errors import FormatError, UsageError
from ckptrepo.ledger import journal
from ckptrepo.maintenance import retention
from ckptrepo.storage import Backend
from ckptrepo.types import RetentionRules

KEY = "retention"


def read(s: Session) -> RetentionRules | None:
    """The stored rules, or None. FormatError when the stored value is not valid rules."""
    text = s.scalar(select(RepoMeta.value).where(RepoMeta.key == KEY))
    if text is None:
        return None
    try:
        return retention.checked(RetentionRules.from_json(json.loads(text)))
    except (ValueError, TypeError, KeyError, IndexError, UsageError) as exc:
        raise FormatError(detail=f"the stored retention setting is not valid ({exc})",
                          hint="Store it again with `ckpt prune --save ...`, or remove it with "
                               "`ckpt prune --forget`.") from exc


def write(sessions: sessionmaker[Session], backend: Backend, rules: RetentionRules | None) -> None:
    """Store ``rules`` (validated) as the setting, or remove it (None): journaled first, then
    one write transaction."""
    text = None if rules is None else json.dumps(retention.checked(rules).to_json(), sort_keys=True)
    change = {"op": "retention", "rules": None if text is None else json.loads(text)}
    with journal.entry(backend, change) as key, write_transaction(sessions) as s:
        catalog.record_journal_key(s, key)
        s.execute(delete(RepoMeta).where(RepoMeta.key == KEY))
        if text is not None:
            s.add(RepoMeta(key=KEY, value=text))
