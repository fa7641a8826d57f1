"""What the store holds besides packs, so that it alone can rebuild the database: one manifest
object per commit (``manifest``) and a journal of the changes no manifest records (``journal``:
ref changes outside commits, prune marks, the retention setting). Store-only: no database, no
torch; ``maintenance.rebuild`` reads both back."""
