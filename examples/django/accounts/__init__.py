"""The example's one app: two kinds of locked task and ``manage.py enqueue_duplicates``."""
