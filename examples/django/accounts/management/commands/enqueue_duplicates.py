"""``python manage.py enqueue_duplicates --n 5``: send duplicates, wait, say what ran.

Needs a worker: ``celery -A proj worker -P prefork -c 4``.
"""

from django.core.management.base import BaseCommand

from accounts.tasks import rebuild_statement, sync_account
from celery_redislock import TaskSkipped


def peak_overlap(runs: list) -> int:
    """The most runs that were running at one instant."""
    edges = sorted([(r["start"], 1) for r in runs] + [(r["end"], -1) for r in runs])
    peak = now = 0
    for _, step in edges:  # an end sorts before a start at the same instant
        now += step
        peak = max(peak, now)
    return peak


class Command(BaseCommand):
    help = "Enqueue duplicate runs of the locked tasks and report what the workers did."

    def add_arguments(self, parser):
        parser.add_argument("--n", type=int, default=5, help="duplicates of each task")
        parser.add_argument("--account", type=int, default=42, help="the account id")
        parser.add_argument("--timeout", type=float, default=60.0, help="seconds per result")

    def handle(self, *args, n, account, timeout, **options):
        for task, how in (
            (sync_account, 'base=LockedTask, on_contention="skip"'),
            (rebuild_statement, 'CELERY_REDISLOCK_TASKS, on_contention="park"'),
        ):
            results = [task.delay(account) for _ in range(n)]
            values = [r.get(timeout=timeout, propagate=False) for r in results]
            runs = [v for v in values if isinstance(v, dict)]
            skipped = sum(isinstance(v, TaskSkipped) for v in values)
            failed = len(values) - len(runs) - skipped
            name = task.name.rsplit(".", 1)[-1]
            self.stdout.write(
                f"{name}({account}) x {n} ({how}): {len(runs)} ran, {skipped} skipped, "
                f"{failed} failed; at most {peak_overlap(runs)} running at once"
            )
