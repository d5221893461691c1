"""An existing task module: plain Celery."""

import time

from celery import shared_task


@shared_task(name="billing.charge")
def charge(customer_id: int, cents: int) -> str:
    time.sleep(0.5)  # the payment provider
    return f"charged customer {customer_id} {cents} cents"
