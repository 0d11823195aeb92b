"""The relay's statements stay index scans over a large history of sent messages and a large backlog, in
the generic plan a prepared statement runs with: a claim never sorts or scans the table."""

from __future__ import annotations

import pytest

from support import positional

# case -> (its parameters as SQL literals, the index its plan must use: one of them); a case is a
# statement's name, or "name:mode" for one statement run in several ways
CASES = {
    "claim:claimed": ({"topics": "ARRAY['t']::text[]", "limit": "100", "owner": "'o'", "lease": "30.0"}, "outbox_claim_idx"),
    "claim:transaction": ({"topics": "NULL::text[]", "limit": "100", "owner": "NULL::text", "lease": "NULL::float8"},
                          "outbox_claim_idx"),
    "rescue_expired": ({}, "outbox_lease_idx"),
    "finish": ({"ids": "ARRAY[1,2]::bigint[]", "states": "ARRAY['sent','sent']", "delays": "ARRAY[NULL,NULL]::float8[]",
                "errors": "ARRAY[NULL,NULL]::text[]", "expect": "'delivering'", "owner": "'o'", "bump": "0"}, "outbox_pkey"),
    "extend_lease": ({"owner": "'o'", "ids": "ARRAY[1,2]::bigint[]", "lease": "30.0"}, "outbox_pkey|outbox_lease_idx"),
}


def _prepare(cur, statement: str) -> list[str]:
    """PREPARE the named statement with $n parameters; returns the parameter names in $n order."""
    text, names = positional(statement)
    cur.execute("PREPARE q AS " + text)
    return names


@pytest.fixture
def history(db):
    """20,000 sent messages, a 5,000-message backlog (a third keyed), 50 in flight, analysed."""
    db.execute("INSERT INTO skiplock.outbox (topic, payload, idempotency_key, state, finished_at) "
               "SELECT 't', '{}', 'sent-' || g, 'sent', now() FROM generate_series(1, 20000) g")
    db.execute("INSERT INTO skiplock.outbox (topic, key, payload, idempotency_key) "
               "SELECT 't', CASE WHEN g % 3 = 0 THEN 'k' || (g % 40) END, '{}', 'p-' || g FROM generate_series(1, 5000) g")
    db.execute("UPDATE skiplock.outbox SET state = 'delivering', owner = 'o', lease_expires_at = now() + interval '1 hour' "
               "WHERE id IN (SELECT id FROM skiplock.outbox WHERE state = 'pending' ORDER BY id LIMIT 50)")
    db.execute("ANALYZE skiplock.outbox")
    return db


@pytest.mark.parametrize("name", sorted(CASES))
def test_relay_statements_use_their_index_in_the_generic_plan(app, history, name):
    args, index = CASES[name]
    with history.cursor() as cur:
        names = _prepare(cur, app.outbox.store.q[name.split(":")[0]])
        cur.execute("SET plan_cache_mode = force_generic_plan")  # what a prepared statement runs with
        values = ", ".join(args[n] for n in names)
        plan = "\n".join(r[0] for r in cur.execute(f"EXPLAIN EXECUTE q{f'({values})' if values else ''}").fetchall())
    assert any(f"using {i}" in plan for i in index.split("|")), plan
    assert "Seq Scan on outbox" not in plan and "Sort" not in plan, plan
