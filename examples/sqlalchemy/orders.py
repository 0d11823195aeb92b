"""skiplock with SQLAlchemy 2 (docs/sqlalchemy.md): an ``orders`` model; an order and its ``charge`` job
are committed together (or not at all), and the handler updates the order through a Session on the
job's own connection, so the update commits with the job.

``SKIPLOCK_EXAMPLE_DSN=... python orders.py`` prints the orders and jobs as JSON."""

from __future__ import annotations

import json
import os

from psycopg import conninfo
from sqlalchemy import String, create_engine, select
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

import skiplock
from skiplock.contrib import sqlalchemy as sl


class Base(DeclarativeBase):
    pass


class Order(Base):
    __tablename__ = "orders"
    id: Mapped[int] = mapped_column(primary_key=True)
    item: Mapped[str] = mapped_column(String(100))
    status: Mapped[str] = mapped_column(String(20), default="new")


def sqlalchemy_url(dsn: str) -> str:
    params = conninfo.conninfo_to_dict(dsn)
    dbname = params.pop("dbname")
    return f"postgresql+psycopg:///{dbname}?" + "&".join(f"{k}={v}" for k, v in params.items())


dsn = os.environ["SKIPLOCK_EXAMPLE_DSN"]
engine = create_engine(sqlalchemy_url(dsn))
app = skiplock.App(dsn)


@app.task("charge", max_attempts=1)
def charge(job: skiplock.Job, order_id: int) -> str:
    with sl.session(job, engine=engine) as s:  # the job's transaction
        order = s.get(Order, order_id)
        if order.item == "declined":
            order.status = "charged"  # rolled back with the failed job
            raise ValueError("card declined")
        order.status = "charged"
    return "charged"


def place(item: str, fail: bool = False) -> None:
    with Session(engine) as s:
        order = Order(item=item)
        s.add(order)
        s.flush()
        sl.enqueue(app, s, "charge", {"order_id": order.id})
        if fail:
            s.rollback()  # neither the order nor its job
            return
        s.commit()


if __name__ == "__main__":
    app.migrate()
    Base.metadata.create_all(engine)
    place("book")
    place("declined")
    place("lamp", fail=True)
    app.worker(concurrency=2, handle_signals=False, maintenance=False).run(stop_when_empty=True)
    with Session(engine) as s:
        orders = [(o.item, o.status) for o in s.scalars(select(Order).order_by(Order.id))]
    jobs = [(j.task, j.state.value, j.result) for j in reversed(app.list_jobs())]
    print(json.dumps({"orders": orders, "jobs": jobs}))
    app.close()
