"""The layer conformance suite: what every optional layer promises (docs/contract.md, "Optional
layers — one shape"), proved for each layer testkit.layers finds, the same way. River's one
driver test suite, which every database driver runs, is the model: the suite is generic, and a
layer supplies a small driver (layers/NAME/conformance.py, testkit.conformance) that knows how
to make a lease hold work in flight in it, finish it and supersede it. A new layer gets all of
it by existing:

- its install: lockdown is its last change; it registers itself in pgfence.layers; it refuses
  to install without what it needs; Sqitch and the one-file install make the same schema; it
  leaves pgfence's own record of its schema alone, and its own sees a function changed by hand;
- no capability (lease id, attempt id) readable by pgfence_monitor or pgfence_operator in any
  table or view, with live, accepted and stale work in the layer;
- the third party's grants hold: a worker the third party would refuse is refused through the
  layer (acting for the role set, not the session's user);
- every function a worker calls that locks rows others need bounds its transaction's idle time
  as the core's do, and the driver names every function a worker may call;
- its prune and health run with the core's (the core's "roles and grants" covers its
  schema); the core's prune keeps the leases its open work names; update windows count its
  work in flight, and call a silent holder's work unknown; lease_status counts it per lease;
- it reads none of the core's tables that hold capabilities (pgfence.leases,
  pgfence.signing_key) and hangs no trigger on the core's tables: it calls the core's
  functions and hooks into it through pgfence.layers;
- upgrade from each earlier release of it with live state (by the one-file upgrades and by
  Sqitch, and Sqitch's revert and deploy again), and its upgrade files refuse a layer changed
  by hand and the other wrong starts.

Each with a negative control that breaks the mechanism (a mutant of the catalogue, or the
layer's registration, grants or install) and sees the check fail.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from pgfence.releases import key as version_key
from testkit import install, layers
from testkit.cluster import Cluster, ClusterError
from testkit.conformance import Call, driver
from testkit.harness import Database, Session, sqlstate
from testkit.install import sqitch
from testkit.layers import Layer
from tests.support import ROOT, acquired, bundle_query
from tests.test_upgrade import (
    HEAD,
    LEGACY,
    RELEASES,
    UPGRADES,
    Databases,
    check_live_state,
    layer_steps,
    make_live_state,
    refused,
    schema_dump,
)

LAYERS = layers.discover()
DRIVERS = {layer.name: driver(layer) for layer in LAYERS}
RESOURCE = "conformance"
ROLES = ("pgfence_monitor", "pgfence_operator")


def by_layer(cases: list[tuple[Layer, Any]]) -> list[Any]:
    """pytest params of (layer, case) pairs, named layer-case."""
    return [pytest.param(layer, case, id=f"{layer.name}-{case}") for layer, case in cases]


@pytest.fixture(params=LAYERS, ids=[layer.name for layer in LAYERS])
def layer(request: pytest.FixtureRequest) -> Layer:
    found: Layer = request.param
    return found


@pytest.fixture
def ldb(layered: Callable[..., Database], layer: Layer) -> Database:
    """A fresh database with the layer, its work's third-party objects and resource."""
    db = layered(layer.name)
    DRIVERS[layer.name].prepare(db, RESOURCE)
    return db


def started(db: Database, layer: Layer, name: str = "w") -> tuple[Session, uuid.UUID, uuid.UUID]:
    """A worker session, its lease on the resource and one piece of work in flight under it."""
    s = db.session(name)
    lease = acquired(s.acquire(RESOURCE)).lease_id
    return s, lease, DRIVERS[layer.name].start(s, lease)


# -- its install ----------------------------------------------------------------------------------

ACLS = """
select coalesce(string_agg(x, E'\\n' order by x), '') from (
  select p.oid::regprocedure::text || ' ' || coalesce(p.proacl::text, '-') as x
    from pg_proc p where p.pronamespace = %(schema)s::regnamespace
  union all
  select c.oid::regclass::text || ' ' || coalesce(c.relacl::text, '-')
    from pg_class c where c.relnamespace = %(schema)s::regnamespace
  union all
  select n.nspname || ' ' || coalesce(n.nspacl::text, '-')
    from pg_namespace n where n.oid = %(schema)s::regnamespace) a
"""


@contextmanager
def under_hostile_defaults(cluster: Cluster, layer: Layer,
                           text: str | None = None) -> Iterator[tuple[Database, str]]:
    """A database whose default privileges hand every new function, table and sequence to a
    role of its own (as Supabase's hand them to anon and authenticated), and the layer
    installed there (its one-file install, or ``text``) after what it needs."""
    name, role = f"t_{uuid.uuid4().hex[:12]}", f"hostile_{uuid.uuid4().hex[:10]}"
    cluster.psql("postgres", "-c", f"create role {role}")
    cluster.create_database(name)
    try:
        cluster.psql(name, "-c", f"alter default privileges grant all on functions to {role}",
                     "-c", f"alter default privileges grant all on tables to {role}",
                     "-c", f"alter default privileges grant all on sequences to {role}")
        install.prerequisites(cluster, name, [layer.name])
        install.core(cluster, name)
        for need in layer.needs:
            install.layer(cluster, name, need)
        if text is None:
            install.layer(cluster, name, layer.name)
        else:
            cluster.psql(name, "--single-transaction", "-c", text)
        db = Database(cluster.dsn(name))
        try:
            yield db, role
        finally:
            db.close()
    finally:
        cluster.drop_database(name)
        cluster.psql("postgres", "-c", f"drop role {role}")


HELD = """
select count(*) from (
  select from pg_proc p where p.pronamespace = %(schema)s::regnamespace
     and has_function_privilege(%(role)s, p.oid, 'execute')
  union all
  select from pg_class c where c.relnamespace = %(schema)s::regnamespace
     and has_table_privilege(%(role)s, c.oid, 'select, insert, update, delete')) x
"""


def locked_down(db: Database, schema: str, role: str) -> bool:
    """Whether the role that default privileges favour holds nothing in the layer's schema, and
    pgfence.lockdown, applied once more, changes no privilege there: so it was the layer's
    last change (whatever came after it would carry the default privileges)."""
    before = db.one(ACLS, {"schema": schema})
    held = db.one(HELD, {"schema": schema, "role": role})
    db.sql("select pgfence.lockdown(%s)", (schema,))
    return bool(held == 0 and db.one(ACLS, {"schema": schema}) == before)


def changes(layer: Layer) -> list[str]:
    """The changes of the layer's one-file install, in order."""
    return re.split(r"(?m)^(?=-- change: )", layer.bundle.read_text())[1:]


# (And the guard of a section's first change, which expects the release a seal records.)
LOCKS_DOWN_CALL = re.compile(r"pgfence\.(seal|lockdown|expect_release)\('pgfence_\w+'[^)]*\)")


def test_lockdown_is_the_layers_last_change(cluster: Cluster, layer: Layer) -> None:
    # Its last change seals it (pgfence.seal: the lockdown and the record of its schema).
    assert f"pgfence.seal('{layer.schema}'" in changes(layer)[-1], changes(layer)[-1][:300]
    with under_hostile_defaults(cluster, layer) as (db, role):
        assert db.one(ACLS, {"schema": layer.schema}).count("\n") >= 5
        assert locked_down(db, layer.schema, role) is True


def test_negative_control_a_layer_without_its_lockdown_is_found(cluster: Cluster,
                                                                layer: Layer) -> None:
    # Each lockdown (and seal) call made a no-op; the rest of its change still runs.
    unlocked, calls = LOCKS_DOWN_CALL.subn("pg_catalog.now()", "".join(changes(layer)))
    assert calls > 0
    with under_hostile_defaults(cluster, layer, unlocked) as (db, role):
        assert locked_down(db, layer.schema, role) is False


def test_the_layer_registers_itself(layered: Callable[..., Database], layer: Layer) -> None:
    db = layered(layer.name)
    [(in_flight, leases, prune, health)] = db.sql(
        "select in_flight::text, leases::text, prune::text, health::text from pgfence.layers "
        "where schema_name = %s", (layer.schema,))
    s = layer.schema
    assert (in_flight, leases, prune, health) == (
        f"{s}.in_flight()", f"{s}.leases()", f"{s}.prune(interval)", f"{s}.health()")


REFUSALS = by_layer([(layer, missing) for layer in LAYERS
                     for missing in ["pgfence", *(f"the {n} layer" for n in layer.needs),
                                     *(p.name for p in layer.prerequisites)]])


@pytest.mark.parametrize(("layer", "missing"), REFUSALS)
def test_the_layer_refuses_without_what_it_needs(cluster: Cluster, layer: Layer,
                                                 missing: str) -> None:
    """Without pgfence, a layer it needs, or a prerequisite of its own: refused (55000, "needs
    ..."), and nothing of it is left."""
    name = f"t_{uuid.uuid4().hex[:12]}"
    cluster.create_database(name)
    try:
        install.prerequisites(cluster, name, layer.needs)
        for found in layer.prerequisites:
            if found.name != missing:
                install.prerequisite(cluster, name, found)
        if missing != "pgfence":
            install.core(cluster, name)
            for below in layers.with_needs(layer.needs):
                if f"the {below.name} layer" != missing:
                    install.layer(cluster, name, below.name)
        with pytest.raises(Exception, match=f"needs {missing}"):
            install.layer(cluster, name, layer.name)
        assert cluster.psql(name, "-At", "-c", f"select to_regnamespace('{layer.schema}') is null"
                            ).strip() == "t"
    finally:
        cluster.drop_database(name)


def test_sqitch_and_the_bundle_install_the_same_layer(
        cluster: Cluster, sqitch_template: Callable[[str], str], layer: Layer) -> None:
    by_sqitch, by_bundle = (f"t_{uuid.uuid4().hex[:12]}" for _ in range(2))
    try:
        # by_sqitch: what `sqitch deploy` of the core made (a clone), then the prerequisites
        # and `sqitch deploy` of the layers; by_bundle: testkit.install's one-file recipe.
        cluster.create_database(by_sqitch, sqitch_template(""))
        install.prerequisites(cluster, by_sqitch, [layer.name])
        for each in layers.with_needs([layer.name]):
            install.layer(cluster, by_sqitch, each.name, "sqitch")
        cluster.create_database(by_bundle)
        install.install(cluster, by_bundle, [layer.name])
        assert schema_dump(by_sqitch) == schema_dump(by_bundle)
        assert f"CREATE SCHEMA {layer.schema};" in schema_dump(by_bundle)
        for step in (["verify"], ["revert", "-y"]):
            sqitch(*step, f"db:pg:{by_sqitch}", layer=layer.name)
        gone = f"select to_regnamespace('{layer.schema}') is null"
        assert cluster.psql(by_sqitch, "-At", "-c", gone).strip() == "t"
    finally:
        cluster.drop_database(by_sqitch)
        cluster.drop_database(by_bundle)


FINGERPRINT = (ROOT / "migrations/fingerprint.sql").read_text()


def test_the_layer_leaves_pgfences_record_of_its_schema_alone(
        layered: Callable[..., Database], db: Database, layer: Layer) -> None:
    # pgfence's next upgrade checks its schema against its release's record: the layer's
    # objects must not make a database with the layer look changed by hand.
    assert layered(layer.name).one(FINGERPRINT) == db.one(FINGERPRINT)


def test_negative_control_a_record_that_counts_the_layer(layered: Callable[..., Database],
                                                        db: Database, layer: Layer) -> None:
    query = FINGERPRINT.replace(
        "p.pronamespace operator(pg_catalog.=) 'pgfence'::pg_catalog.regnamespace",
        "p.pronamespace::pg_catalog.regnamespace::pg_catalog.text like 'pgfence%'")
    assert query != FINGERPRINT
    assert layered(layer.name).one(query) != db.one(query)


def changed_by_hand(db: Database, layer: Layer) -> None:
    """A function of the layer replaced by hand: its body with one more statement."""
    call = DRIVERS[layer.name].calls[0]
    src = str(db.one("select pg_get_functiondef(%s::regprocedure)", (call.signature,)))
    assert "\nbegin\n" in src, src[:300]
    db.sql(src.replace("\nbegin\n", "\nbegin\n  perform 1;\n", 1))


def test_the_layers_record_of_its_schema_sees_a_function_changed_by_hand(
        layered: Callable[..., Database], layer: Layer) -> None:
    db = layered(layer.name)
    ours = bundle_query("fingerprint.sql", layer.schema)
    before, core = db.one(ours), db.one(FINGERPRINT)
    changed_by_hand(db, layer)
    assert db.one(ours) != before
    # (Aimed at the layer's schema: pgfence's own record does not see it.)
    assert db.one(FINGERPRINT) == core


# -- no capability readable -----------------------------------------------------------------------

def live_state(db: Database, layer: Layer) -> set[str]:
    """Work of the layer accepted, in flight and superseded (its stale result recorded), and
    the capabilities they and the leases make."""
    d = DRIVERS[layer.name]
    s, lease, done = started(db, layer)
    assert d.finish(s, done) == "accepted"
    d.start(s, lease)                               # in flight
    stale = d.start(s, lease)                       # superseded, latest start
    db.expire(lease)
    d.supersede(db, stale)
    assert d.finish(s, stale) == "stale"
    found = {str(v) for (v,) in db.sql(d.capabilities)}
    found |= {str(v) for (v,) in db.sql("select lease_id from pgfence.leases")}
    assert len(found) >= 5, found
    return found


def readable(db: Database, role: str) -> list[tuple[str, str]]:
    """(relation, column) of every column of a pgfence schema that role can SELECT."""
    return [(str(r), str(c)) for r, c in db.sql("""
      select c.oid::regclass::text, a.attname
        from pg_class c
        join pg_namespace n on n.oid = c.relnamespace
        join pg_attribute a on a.attrelid = c.oid and a.attnum > 0 and not a.attisdropped
       where (n.nspname = 'pgfence' or n.nspname like 'pgfence\\_%%')
         and n.nspname <> 'pgfence_test'
         and c.relkind in ('r', 'v', 'm', 'p', 'f')
         and has_column_privilege(%s, c.oid, a.attnum, 'select')
       order by 1, 2""", (role,))]


def capabilities_seen(db: Database, capabilities: set[str], schema: str) -> list[str]:
    """What monitor and operator can read of the capabilities: "role: relation.column" of each."""
    hits = []
    s = db.session("reader")
    for role in ROLES:
        columns = readable(db, role)
        assert any(rel.startswith(f"{schema}.") for rel, _ in columns), (
            f"{role} reads nothing of {schema}: the walk would prove nothing")
        s.run(f"set role {role}")
        for rel, col in columns:
            values = s.run(f'select "{col}"::text from {rel}')
            if any(v is not None and any(c in v for c in capabilities) for (v,) in values):
                hits.append(f"{role}: {rel}.{col}")
        s.run("reset role")
    return hits


def references_seen(db: Database, schema: str) -> set[str]:
    """Every value pgfence_monitor can read in the layer's schema."""
    s = db.session("referee")
    s.run("set role pgfence_monitor")
    seen = {str(v) for rel, col in readable(db, "pgfence_monitor") if rel.startswith(f"{schema}.")
            for (v,) in s.run(f'select "{col}"::text from {rel}') if v is not None}
    s.run("reset role")
    return seen


def test_monitor_and_operator_read_no_capability_anywhere(ldb: Database, layer: Layer) -> None:
    capabilities = live_state(ldb, layer)
    assert capabilities_seen(ldb, capabilities, layer.schema) == []
    # They see a reference to each of the layer's capabilities instead (pgfence.capability_ref),
    # which correlates the rows that name it.
    ours = [v for (v,) in ldb.sql(DRIVERS[layer.name].capabilities)]
    ref = "select pgfence.capability_ref(c) from unnest(%s::uuid[]) c"
    refs = {str(r) for (r,) in ldb.sql(ref, (ours,))}
    seen = references_seen(ldb, layer.schema)
    assert len(refs) >= 3 and refs <= seen, refs - seen
    assert all(re.fullmatch(r"[0-9a-f]{16}", r) for r in refs), refs   # 16 hex digits
    # ... and to each lease that holds the layer's work (both, here: the first and its
    # successor's, which took the stale attempt's work over).
    holders = [v for (v,) in ldb.sql("select distinct lease_id from pgfence.leases")]
    lease_refs = {str(r) for (r,) in ldb.sql(ref, (holders,))} & seen
    assert len(lease_refs) >= 2, lease_refs


def test_negative_control_a_capability_granted_is_found(ldb: Database, layer: Layer) -> None:
    capabilities = live_state(ldb, layer)
    ldb.sql(f"grant select on all tables in schema {layer.schema} to pgfence_monitor")
    hits = capabilities_seen(ldb, capabilities, layer.schema)
    assert any(hit.startswith(f"pgfence_monitor: {layer.schema}.") for hit in hits), hits


# -- the third party's grants hold ----------------------------------------------------------------

@pytest.fixture
def worker_role(ldb: Database) -> Iterator[str]:
    """A role with pgfence_worker and nothing of the third party's."""
    role = f"w_{uuid.uuid4().hex[:10]}"
    ldb.sql(f"create role {role} in role pgfence_worker")
    yield role
    ldb.sql(f"drop owned by {role}")
    ldb.sql(f"drop role {role}")


def grants_hold(db: Database, layer: Layer, role: str) -> None:
    """As PostgREST and Supabase run requests (a privileged session user, SET ROLE to the
    request's role), the layer acts for the role set, and only where the third party itself
    would let it: refused without the third party's grants, refused again without one
    privilege finishing needs, accepted with all of them."""
    d = DRIVERS[layer.name]
    w = db.session(role)
    assert w.one("select pgfence.invoker()") == "postgres"
    w.run(f"set role {role}")
    lease = acquired(w.acquire(RESOURCE)).lease_id
    assert sqlstate(lambda: d.start(w, lease)) == "42501", "no grant of the third party: no start"
    d.grant(db, role)
    attempt = d.start(w, lease)
    d.withhold(db, role)
    assert sqlstate(lambda: d.finish(w, attempt)) == "42501", "a privilege withheld: no finish"
    d.grant(db, role)
    assert d.finish(w, attempt) == "accepted"


def test_a_worker_does_through_the_layer_only_what_the_third_party_lets_it(
        ldb: Database, layer: Layer, worker_role: str) -> None:
    grants_hold(ldb, layer, worker_role)


GRANT_CHECKS = by_layer([(layer, m) for layer in LAYERS for m in DRIVERS[layer.name].grant_checks])


@pytest.mark.parametrize(("layer", "mutant"), GRANT_CHECKS)
def test_negative_control_without_its_check_the_layer_widens_the_third_partys_grants(
        ldb: Database, layer: Layer, worker_role: str, mutant: str) -> None:
    ldb.install_mutant(mutant)
    with pytest.raises(AssertionError):
        grants_hold(ldb, layer, worker_role)


# -- idle bounds ----------------------------------------------------------------------------------

LIMIT = "select setting::int from pg_settings where name = 'idle_in_transaction_session_timeout'"


def idle_limit_after(db: Database, layer: Layer, call: Call) -> int:
    """idle_in_transaction_session_timeout in force in a worker's transaction right after the
    call (ms; 0 is none), under a lease of an hour, with a piece of work in flight where the
    call names an attempt."""
    w, lease, attempt = started(db, layer, f"w-{uuid.uuid4().hex[:8]}")
    if call.ended:
        db.sql("select pgfence.release(%s)", (lease,))
    w.begin()
    w.run(call.sql.format(lease=lease, attempt=attempt, resource=RESOURCE))
    limit = int(w.one(LIMIT))
    w.rollback()
    db.sql("select pgfence.release(%s)", (lease,))   # the resource free for the next call
    return limit


# Each call that locks rows, of each layer; one the layer does not bound yet is a strict xfail
# with the driver's reason: the suite finds it, and fails once the layer is fixed, until the
# driver says so.
IDLE = [pytest.param(layer, call.signature, id=f"{layer.name}-{call.signature}",
                     marks=[pytest.mark.xfail(strict=True, raises=AssertionError,
                                              reason=call.unbounded)]
                     if call.unbounded else [])
        for layer in LAYERS for call in DRIVERS[layer.name].calls if call.locks]


def call_of(layer: Layer, signature: str) -> Call:
    return next(c for c in DRIVERS[layer.name].calls if c.signature == signature)


@pytest.mark.parametrize(("layer", "signature"), IDLE)
def test_a_call_that_locks_rows_bounds_its_transactions_idle_time(
        layered: Callable[..., Database], layer: Layer, signature: str) -> None:
    """As the core's functions do (5 s, limit_idle; or what the lease had left, hold_current):
    tests/test_idle_bound.py shows the bound then ends the idle session and lets the
    successor through."""
    db = layered(layer.name)
    DRIVERS[layer.name].prepare(db, RESOURCE)
    limit = idle_limit_after(db, layer, call_of(layer, signature))
    assert 0 < limit <= 3_600_000, f"{signature} leaves its transaction free to idle ({limit} ms)"


def test_negative_control_without_the_idle_limits_the_calls_are_unbounded(
        ldb: Database, layer: Layer) -> None:
    ldb.install_mutant("limit-idle-never-set", "idle-limit-never-set")
    bounded = [c for c in DRIVERS[layer.name].calls if c.locks and not c.unbounded]
    assert bounded
    assert {c.signature: idle_limit_after(ldb, layer, c) for c in bounded} == dict.fromkeys(
        (c.signature for c in bounded), 0)


WORKER_FUNCTIONS = """
select coalesce(array_agg(p.oid::regprocedure::text order by p.oid::regprocedure::text), '{}')
  from pg_proc p
 where p.pronamespace = %s::regnamespace and has_function_privilege('pgfence_worker', p.oid,
                                                                    'execute')
"""


def test_the_driver_names_every_function_a_worker_may_call(
        layered: Callable[..., Database], layer: Layer) -> None:
    # So no function a worker calls escapes the idle-bound check above.
    db = layered(layer.name)
    assert db.one(WORKER_FUNCTIONS, (layer.schema,)) == sorted(
        c.signature for c in DRIVERS[layer.name].calls)


def test_negative_control_a_function_the_driver_does_not_name_is_found(
        layered: Callable[..., Database], layer: Layer) -> None:
    db = layered(layer.name)
    db.sql(f"create function {layer.schema}.extra() returns int language sql as 'select 1'")
    db.sql(f"grant execute on function {layer.schema}.extra() to pgfence_worker")
    assert f"{layer.schema}.extra()" in db.one(WORKER_FUNCTIONS, (layer.schema,))


# -- prune and health, with the core's ------------------------------------------------------------

def pruned_and_checked(db: Database, layer: Layer) -> tuple[set[str], set[str]]:
    """What pgfence.prune reported of the layer, and the layer's checks pgfence.health ran."""
    d = DRIVERS[layer.name]
    s, _, attempt = started(db, layer)
    assert d.finish(s, attempt) == "accepted"
    pruned = {str(what) for what, _ in db.sql("select * from pgfence.prune('1 hour')")
              if str(what).startswith(f"{layer.schema}.")}
    own = {str(c) for (c,) in db.sql(f'select "check" from {layer.schema}.health()')}
    checks = {str(c) for (c,) in db.sql('select "check" from pgfence.health()')} & own
    return pruned, checks


def test_the_cores_prune_and_health_run_the_layers(ldb: Database, layer: Layer) -> None:
    pruned, checks = pruned_and_checked(ldb, layer)
    assert pruned and checks
    assert ldb.one(f"select bool_and(ok) from {layer.schema}.health()") is True
    # The core's "roles and grants" sees a privilege handed out in its schema (the layers no
    # longer check it themselves).
    grants = "select ok, detail from pgfence.health() where \"check\" = 'roles and grants'"
    assert ldb.sql(grants)[0][0] is True
    ldb.sql(f"grant execute on all functions in schema {layer.schema} to public")
    [(ok, detail)] = ldb.sql(grants)
    handed_out = f"PUBLIC may EXECUTE function {layer.schema}.prune(interval)"
    assert ok is False and handed_out in detail, detail


def test_negative_control_a_layer_missing_from_the_registry_is_neither_pruned_nor_checked(
        ldb: Database, layer: Layer) -> None:
    ldb.sql("delete from pgfence.layers where schema_name = %s", (layer.schema,))
    assert pruned_and_checked(ldb, layer) == (set(), set())


def late_result_after_prune(db: Database, layer: Layer) -> str:
    """Work started under a lease superseded long ago, still in flight (a long handler); then
    pgfence.prune. The late result, which nobody overtook, is still judged by its attempt."""
    d = DRIVERS[layer.name]
    s, old, attempt = started(db, layer)
    db.expire(old)
    acquired(db.session("successor").acquire(RESOURCE))
    db.sql("update pgfence.leases set ended_at = ended_at - interval '2 days' "
           "where lease_id = %s", (old,))
    assert "leases" in dict(db.sql("select * from pgfence.prune('1 day')"))
    assert db.one("select count(*) from pgfence.leases where lease_id = %s", (old,)) == 1, (
        "the lease the layer's open work names was pruned")
    return d.finish(s, attempt)


def test_the_cores_prune_keeps_the_leases_the_layers_open_work_names(ldb: Database,
                                                                    layer: Layer) -> None:
    assert late_result_after_prune(ldb, layer) == "accepted"


def test_negative_control_a_prune_blind_to_the_layers_leases(ldb: Database,
                                                            layer: Layer) -> None:
    ldb.install_mutant("prune-ignores-layer-leases")
    with pytest.raises(AssertionError, match="was pruned"):
        late_result_after_prune(ldb, layer)


# -- update windows count the layer's work --------------------------------------------------------

def window_over_work_in_flight(db: Database, layer: Layer) -> tuple[str, dict[str, int], str]:
    """A worker's work still in flight after it released its lease (its handler may still
    run), an update window over the resource: update_status's verdict and counts, then its
    verdict once the work finished."""
    d = DRIVERS[layer.name]
    s, lease, attempt = started(db, layer)
    db.sql("select pgfence.release(%s)", (lease,))
    token = db.session("op").one("select pgfence.prepare_update(array[%s], %s)",
                                 (RESOURCE, uuid.uuid4()))
    status = "select verdict, in_flight from pgfence.update_status(%s)"
    [(verdict, in_flight)] = db.sql(status, (token,))
    assert d.finish(s, attempt) == "accepted"
    return str(verdict), dict(in_flight), str(db.sql(status, (token,))[0][0])


@pytest.mark.parametrize("how", ["direct", "pgbouncer"])
def test_work_in_flight_keeps_the_window_draining(layered: Callable[..., Database],
                                                  layer: Layer, how: str) -> None:
    db = layered(layer.name, how)
    DRIVERS[layer.name].prepare(db, RESOURCE)
    verdict, in_flight, after = window_over_work_in_flight(db, layer)
    assert (verdict, in_flight.get(layer.name), after) == ("draining", 1, "drained"), in_flight


def test_negative_control_a_layer_not_registered_is_not_counted(ldb: Database,
                                                               layer: Layer) -> None:
    # (A layer's work is often the work of the layers it stands on too: none of them counts.)
    ldb.sql("delete from pgfence.layers where schema_name = any (%s)",
            ([x.schema for x in layers.with_needs([layer.name])],))
    assert window_over_work_in_flight(ldb, layer)[0] == "drained"


def window_over_silent_work(db: Database, layer: Layer) -> list[str]:
    """Work in flight under a worker's lease, a window over the resource: update_status's
    verdict while the worker still renews (the window drained its lease), once it went silent
    (its lease expired, the work still in flight), and once the work finished."""
    d = DRIVERS[layer.name]
    s, lease, attempt = started(db, layer)
    token = db.session("op").one("select pgfence.prepare_update(array[%s], %s)",
                                 (RESOURCE, uuid.uuid4()))
    status = "select verdict from pgfence.update_status(%s)"
    verdicts = [str(db.one(status, (token,)))]
    db.expire(lease)                                   # the worker goes silent
    verdicts.append(str(db.one(status, (token,))))
    assert d.finish(s, attempt) == "accepted"
    return [*verdicts, str(db.one(status, (token,)))]


@pytest.mark.parametrize("how", ["direct", "pgbouncer"])
def test_a_silent_holder_of_work_makes_the_window_unknown(layered: Callable[..., Database],
                                                          layer: Layer, how: str) -> None:
    db = layered(layer.name, how)
    DRIVERS[layer.name].prepare(db, RESOURCE)
    # No proof its handler stopped: unknown, as the core's queue answers for a silent holder.
    assert window_over_silent_work(db, layer) == ["draining", "unknown", "drained"]


def test_negative_control_silence_judged_by_the_cores_tasks_alone_stays_draining(
        ldb: Database, layer: Layer) -> None:
    ldb.install_mutant("update-status-layer-silence-blind")
    assert window_over_silent_work(ldb, layer)[1] == "draining"


def held(db: Database) -> dict[str, int]:
    """lease_status's in_flight of the resource's current lease, read as the monitor."""
    monitor = db.session(f"monitor-{uuid.uuid4().hex[:8]}")
    monitor.run("set role pgfence_monitor")
    found = monitor.one("select in_flight from pgfence.lease_status "
                        "where resource = %s and status = 'current'", (RESOURCE,))
    monitor.run("reset role")
    return dict(found)


def test_lease_status_counts_the_layers_work_a_lease_holds(ldb: Database, layer: Layer) -> None:
    d = DRIVERS[layer.name]
    s, _, attempt = started(ldb, layer)
    work = held(ldb)
    assert (work.pop("tasks"), work.pop(layer.name)) == (0, 1), work
    # (A layer's work may be the work of the layers it stands on too: counted by their kinds.)
    assert set(work) <= set(layers.names()) and set(work.values()) <= {1}, work
    assert d.finish(s, attempt) == "accepted"
    assert held(ldb) == {"tasks": 0}


def test_negative_control_a_lease_status_blind_to_the_layers_shows_nothing_held(
        ldb: Database, layer: Layer) -> None:
    ldb.install_mutant("layer-work-blind")
    started(ldb, layer)
    assert held(ldb) == {"tasks": 0}


# -- the core's tables are the core's: a layer calls its functions (pgfence.hold_fenced,
# mark_lease, lease_facts, owner_ref, ...), and hooks into it through pgfence.layers ------------

def reads_of_the_cores_tables(db: Database, schema: str) -> list[str]:
    """Every function and view of the layer's schema that reads pgfence.leases or
    pgfence.signing_key itself, and every trigger of its functions on a table of the core."""
    return [str(r) for (r,) in db.sql(r"""
      select p.oid::regprocedure::text from pg_proc p
       where p.pronamespace = %(s)s::regnamespace and p.prosrc ~ 'pgfence\.(leases|signing_key)\M'
      union all
      select c.oid::regclass::text from pg_class c
       where c.relnamespace = %(s)s::regnamespace
         and c.relkind in ('v', 'm') and pg_get_viewdef(c.oid) ~ 'pgfence\.(leases|signing_key)\M'
      union all
      select format('trigger %%s on %%s', t.tgname, t.tgrelid::regclass) from pg_trigger t
       where t.tgrelid in (select oid from pg_class where relnamespace = 'pgfence'::regnamespace)
         and t.tgfoid in (select oid from pg_proc where pronamespace = %(s)s::regnamespace)
       order by 1""", {"s": schema})]


def test_the_layer_reads_no_core_table_and_hangs_no_trigger_on_one(ldb: Database,
                                                                   layer: Layer) -> None:
    assert reads_of_the_cores_tables(ldb, layer.schema) == []


def test_negative_control_a_layer_function_that_reads_the_leases_is_named(
        ldb: Database, layer: Layer) -> None:
    ldb.sql(f"create function {layer.schema}.peek() returns bigint language sql "
            "as 'select count(*) from pgfence.leases'")
    ldb.sql(f"create function {layer.schema}.follow() returns trigger language plpgsql "
            "as 'begin return new; end'")
    ldb.sql(f"create trigger follow after update on pgfence.resources "
            f"for each row execute function {layer.schema}.follow()")
    assert reads_of_the_cores_tables(ldb, layer.schema) == [
        f"{layer.schema}.peek()", "trigger follow on pgfence.resources"]


# -- upgrades from each earlier release of the layer, with live state -----------------------------

def layer_releases(layer: str) -> list[str]:
    found = [p.name.removeprefix(f"pgfence-{layer}--").removesuffix(".sql")
             for p in RELEASES.glob(f"pgfence-{layer}--*.sql")]
    return sorted(found, key=version_key)


def layer_chain(layer: str, start: str) -> list[Path]:
    """The layer's upgrade files from its release `start` towards the head, in order (a release
    in which the layer did not change has none from it: the next release's file starts there)."""
    return [p for frm, _, p in layer_steps(layer) if version_key(frm) >= version_key(start)]


def target(step: Path) -> str:
    """The pgfence release a layer upgrade file leads to (it runs on that release)."""
    return step.name.removesuffix(".sql").split("--")[2]


# Each layer with each release of it older than the head: where its upgrades start.
STARTS = by_layer([(layer, v) for layer in LAYERS for v in layer_releases(layer.name)
                   if v != HEAD])
# Each layer upgrade file, by layer and the release it starts from.
FILES = by_layer([(layers.layer(p.name.split("--")[0].removeprefix("pgfence-")),
                   p.name.split("--")[1]) for p in sorted(UPGRADES.glob("pgfence-*--*--*.sql"))])


@pytest.fixture
def dbs(cluster: Cluster) -> Iterator[Databases]:
    made = Databases(cluster)
    yield made
    for name in made.made:
        cluster.drop_database(name)


def install_release_with_layer(dbs: Databases, database: str, layer: Layer,
                               release: str) -> None:
    """What the layer stands on, then pgfence `release` and, of that release, the layer and the
    layers it needs, from the release files; and the work's third-party objects."""
    install.prerequisites(dbs.cluster, database, [layer.name])
    dbs.install_release(database, release)
    for each in layers.with_needs([layer.name]):
        dbs.psql(database, "--single-transaction", "-f",
                 RELEASES / f"pgfence-{each.name}--{release}.sql")
    prepare(dbs, database, layer)


def prepare(dbs: Databases, database: str, layer: Layer) -> None:
    db = Database(dbs.dsn(database))
    try:
        DRIVERS[layer.name].prepare(db, RESOURCE)
    finally:
        db.close()


def head_with_layer(dbs: Databases, layer: Layer) -> str:
    """A fresh install of the head with the layer, and the work's third-party objects."""
    head = dbs.fresh("head")
    install.install(dbs.cluster, head, [layer.name])
    prepare(dbs, head, layer)
    return head


def start_under(dbs: Databases, database: str, layer: Layer, lease: uuid.UUID) -> uuid.UUID:
    db = Database(dbs.dsn(database))
    try:
        return DRIVERS[layer.name].start(db.session("live-layer"), lease)
    finally:
        db.close()


def finish_after(dbs: Databases, database: str, layer: Layer, lease: uuid.UUID,
                 attempt: uuid.UUID) -> None:
    """Started before the upgrade, finished after it: the late result is kept (a retry is a
    duplicate), and new work goes on under the same lease, by the upgraded functions."""
    d = DRIVERS[layer.name]
    db = Database(dbs.dsn(database))
    try:
        s = db.session("after-layer")
        assert d.finish(s, attempt) == "accepted"
        assert d.finish(s, attempt) == "duplicate"
        assert d.finish(s, d.start(s, lease)) == "accepted"
    finally:
        db.close()


@pytest.mark.parametrize("path", ["file", "sqitch"])
@pytest.mark.parametrize(("layer", "start"), STARTS)
def test_upgrade_keeps_live_state_of_the_core_and_the_layer(dbs: Databases, layer: Layer,
                                                            start: str, path: str) -> None:
    name = dbs.fresh("lup")
    install_release_with_layer(dbs, name, layer, start)
    live = make_live_state(dbs, name)
    attempt = start_under(dbs, name, layer, live.current)
    if path == "file":
        dbs.upgrade_by_file(name, start, tuple(x.name for x in layers.with_needs([layer.name])))
    else:
        # One-file installs moved onto Sqitch (--log-only), then deployed to the head.
        sqitch("deploy", "--log-only", "--to", f"@v{start}", f"db:pg:{name}")
        sqitch("deploy", f"db:pg:{name}")
        for each in layers.with_needs([layer.name]):
            sqitch("deploy", "--log-only", "--to", f"@v{start}", f"db:pg:{name}",
                   layer=each.name)
            sqitch("deploy", f"db:pg:{name}", layer=each.name)
    assert dbs.version(name) == HEAD
    assert schema_dump(name) == schema_dump(head_with_layer(dbs, layer))
    finish_after(dbs, name, layer, live.current, attempt)
    check_live_state(dbs, name, live)


@pytest.mark.parametrize("path", ["file", "sqitch"])
def test_pgflow_tasks_started_under_0_3_0_complete_in_one_batch_after_the_upgrade(
        dbs: Databases, path: str) -> None:
    """The pgflow layer's batch (0.3.1, complete_many) takes the results of tasks a worker
    started under 0.3.0, as its single complete_task does: each accepted once, its resend a
    duplicate for each, pgflow's tasks completed with their outputs."""
    layer, flow = layers.layer("pgflow"), "conformance_flow"  # the driver's flow
    name = dbs.fresh("lbatch")
    install_release_with_layer(dbs, name, layer, "0.3.0")
    live = make_live_state(dbs, name)
    db = Database(dbs.dsn(name))
    try:
        s = db.session("before")
        started = [a for (a,) in s.run("select attempt_id from pgfence_pgflow.start_tasks("
                                       "%s, %s, %s, '1 hour', 3)", (live.current, flow, flow))]
        assert len(started) == 3
        if path == "file":
            dbs.upgrade_by_file(name, "0.3.0", ("pgmq", "pgflow"))
        else:
            sqitch("deploy", "--log-only", "--to", "@v0.3.0", f"db:pg:{name}")
            sqitch("deploy", f"db:pg:{name}")
            for each in ("pgmq", "pgflow"):
                sqitch("deploy", "--log-only", "--to", "@v0.3.0", f"db:pg:{name}", layer=each)
                sqitch("deploy", f"db:pg:{name}", layer=each)
        assert db.one("select pgfence.installed_release('pgfence_pgflow')") == HEAD
        after = db.session("after")
        batch = ("select array_agg(outcome order by n) from pgfence_pgflow.complete_many("
                 "%s::uuid[], array(select jsonb_build_object('i', i) "
                 "from generate_series(1, 3) i)) with ordinality m(attempt_id, outcome, n)")
        assert after.one(batch, (started,)) == ["accepted"] * 3
        assert after.one(batch, (started,)) == ["duplicate"] * 3
        assert sorted(db.sql("select st.output ->> 'i' from pgflow.step_tasks st "
                             "join pgfence_pgflow.attempts a using (run_id, step_slug, task_index)"
                             " where a.attempt_id = any(%s) and st.status = 'completed'",
                             (started,))) == [("1",), ("2",), ("3",)]
    finally:
        db.close()
    check_live_state(dbs, name, live)


@pytest.mark.parametrize(("layer", "start"), STARTS)
def test_sqitch_reverts_the_layer_to_its_release_and_deploys_again(dbs: Databases,
                                                                   layer: Layer,
                                                                   start: str) -> None:
    name, release = dbs.fresh("lrev"), dbs.fresh("lrel")
    install_release_with_layer(dbs, release, layer, start)
    below = layers.with_needs([layer.name])
    install.prerequisites(dbs.cluster, name, [layer.name])
    sqitch("deploy", "--to", f"@v{start}", f"db:pg:{name}")
    for each in below:
        sqitch("deploy", "--to", f"@v{start}", f"db:pg:{name}", layer=each.name)
    prepare(dbs, name, layer)
    live = make_live_state(dbs, name)
    attempt = start_under(dbs, name, layer, live.current)
    sqitch("deploy", f"db:pg:{name}")
    for each in below:
        sqitch("deploy", f"db:pg:{name}", layer=each.name)
    head = schema_dump(name)
    for each in reversed(below):
        sqitch("revert", "-y", "--to", f"@v{start}", f"db:pg:{name}", layer=each.name)
    # The target named for the revert's first step (pgfence.check_revert, docs/upgrading.md).
    sqitch("revert", "-y", "--to", f"@v{start}", "--set", f"pgfence_revert_to={start}",
           f"db:pg:{name}")
    assert schema_dump(name) == schema_dump(release)
    for each in below:
        assert layer_fingerprint(dbs, name, each) == layer_fingerprint(dbs, release, each)
    sqitch("deploy", f"db:pg:{name}")
    for each in below:
        sqitch("deploy", f"db:pg:{name}", layer=each.name)
    assert schema_dump(name) == head
    finish_after(dbs, name, layer, live.current, attempt)


def layer_fingerprint(dbs: Databases, database: str, layer: Layer,
                      release: str | None = None) -> str:
    """The fingerprint a layer upgrade from ``release`` checks: up to 0.2.1 the layer's
    fingerprint.sql; from 0.3.0 on pgfence.schema_fingerprint of its schema."""
    if release is not None and version_key(release) > version_key(LEGACY):
        return dbs.psql(database, "-At", "-c",
                        f"select pgfence.schema_fingerprint('{layer.schema}')").strip()
    return dbs.psql(database, "-At", "-c", bundle_query("fingerprint.sql", layer.schema)).strip()


def recorded(layer: Layer) -> dict[str, str]:
    path = RELEASES / f"fingerprints-{layer.name}"
    lines = path.read_text().splitlines() if path.is_file() else []
    return dict(line.split() for line in lines if line.strip() and not line.startswith("#"))


@pytest.mark.parametrize(("layer", "start"), FILES)
def test_the_release_a_layer_upgrade_starts_from_has_its_fingerprint(
        dbs: Databases, layer: Layer, start: str) -> None:
    name = dbs.fresh("lprint")
    install_release_with_layer(dbs, name, layer, start)
    found = layer_fingerprint(dbs, name, layer, start)
    assert recorded(layer).get(start) == found, (
        f"record `{start} {found}` in sql/releases/fingerprints-{layer.name}")


@pytest.mark.parametrize(("layer", "start"), FILES)
def test_negative_control_a_layer_upgrade_missing_a_change_is_caught(
        dbs: Databases, layer: Layer, start: str, tmp_path: Path) -> None:
    step = layer_chain(layer.name, start)[0]
    sections = re.split(r"(?m)^(?=-- change: )", step.read_text())
    # Leave out the first change that is not the section's last (its lockdown, or from 0.3.0
    # on the release's own change, which seals it).
    victims = [i for i, s in enumerate(sections) if s.startswith("-- change: ")
               and "lockdown" not in s.partition("\n")[0]
               and not s.startswith("-- change: release_")]
    if not victims:
        pytest.skip(f"{step.name} holds only the release's own change")
    broken = tmp_path / step.name
    broken.write_text("".join(s for i, s in enumerate(sections) if i != victims[0]))
    name = dbs.fresh("lbroken")
    install_release_with_layer(dbs, name, layer, start)
    below = tuple(x.name for x in layers.with_needs(layer.needs))
    dbs.upgrade_by_file(name, start, below, to=target(step))
    dbs.psql(name, "--single-transaction", "-f", broken)
    try:
        dbs.upgrade_by_file(name, target(step), (*below, layer.name))
    except ClusterError as e:
        # The next layer upgrade file's own check found the layer is not the release it
        # starts from (from 0.3.0 on, pgfence.check_release: not as released).
        assert (f"the {layer.schema} schema differs from the {layer.name} layer" in str(e)
                or f"schema {layer.schema} is not release {target(step)} as released"
                in str(e)), e
        return
    assert schema_dump(name) != schema_dump(head_with_layer(dbs, layer))


# -- a layer upgrade's refusals: nothing changes --------------------------------------------------

def refusal(name: str, step: Path) -> str:
    before = schema_dump(name)
    out = refused(name, step, "--single-transaction")
    assert out.returncode != 0, out.stdout
    assert schema_dump(name) == before
    return out.stderr


@pytest.mark.parametrize(("layer", "start"), FILES)
def test_a_layer_upgrade_refuses_a_layer_changed_by_hand(dbs: Databases, layer: Layer,
                                                         start: str) -> None:
    name = dbs.fresh("lhand")
    install_release_with_layer(dbs, name, layer, start)
    step = layer_chain(layer.name, start)[0]
    dbs.upgrade_by_file(name, start, tuple(x.name for x in layers.with_needs(layer.needs)),
                        to=target(step))
    db = Database(dbs.dsn(name))
    try:
        changed_by_hand(db, layer)
    finally:
        db.close()
    err = refusal(name, step)
    # Up to 0.2.1 the layer's fingerprint.sql; from 0.3.0 on pgfence.check_release.
    said = (f"the {layer.schema} schema differs from the {layer.name} layer of release {start}"
            if version_key(start) <= version_key(LEGACY)
            else f"schema {layer.schema} differs from its release {start} as installed")
    assert said in err, err


@pytest.mark.parametrize(("layer", "start"), FILES)
def test_a_layer_upgrade_refuses_before_pgfence_is_upgraded(dbs: Databases, layer: Layer,
                                                            start: str) -> None:
    name = dbs.fresh("lorder")
    install_release_with_layer(dbs, name, layer, start)
    step = layer_chain(layer.name, start)[0]
    err = refusal(name, step)
    assert f"which runs on pgfence {target(step)}, but the database has pgfence {start}" in err, (
        err)


@pytest.mark.parametrize(("layer", "start"), FILES)
def test_a_layer_upgrade_refuses_a_database_without_the_layer(dbs: Databases, layer: Layer,
                                                              start: str) -> None:
    name = dbs.fresh("lnone")
    install.prerequisites(dbs.cluster, name, [layer.name])
    install.core(dbs.cluster, name)
    err = refusal(name, layer_chain(layer.name, start)[0])
    assert f"no {layer.name} layer in this database" in err, err


@pytest.mark.parametrize(("layer", "start"), FILES)
def test_a_layer_upgrade_refuses_a_layer_that_sqitch_deploys(dbs: Databases, layer: Layer,
                                                             start: str) -> None:
    name = dbs.fresh("lsqitch")
    install.prerequisites(dbs.cluster, name, [layer.name])
    sqitch("deploy", f"db:pg:{name}")
    for each in layers.with_needs([layer.name]):
        sqitch("deploy", "--to", f"@v{start}", f"db:pg:{name}", layer=each.name)
    err = refusal(name, layer_chain(layer.name, start)[0])
    assert f"Sqitch deploys the {layer.name} layer in this database" in err, err
    assert f"cd layers/{layer.name} && sqitch deploy db:pg:{name}" in err, err


@pytest.mark.parametrize(("layer", "start"), FILES)
def test_negative_control_pgfences_own_registry_does_not_stop_a_layer_upgrade(
        dbs: Databases, layer: Layer, start: str) -> None:
    # The registry check asks about the layer's own Sqitch project: pgfence itself deployed by
    # Sqitch (its registry tracks project pgfence), the layers installed from their files, the
    # layer upgrade files apply.
    name = dbs.fresh("lother")
    install.prerequisites(dbs.cluster, name, [layer.name])
    sqitch("deploy", "--to", f"@v{start}", f"db:pg:{name}")
    for each in layers.with_needs([layer.name]):
        dbs.psql(name, "--single-transaction", "-f",
                 RELEASES / f"pgfence-{each.name}--{start}.sql")
    prepare(dbs, name, layer)
    step = layer_chain(layer.name, start)[0]
    # (The head has no tag yet: it is where Sqitch deploys to anyway.)
    sqitch("deploy", *(["--to", f"@v{target(step)}"] if target(step) != HEAD else []),
           f"db:pg:{name}")
    for each in layers.with_needs(layer.needs):
        for below in layer_chain(each.name, start):
            if version_key(target(below)) <= version_key(target(step)):
                dbs.psql(name, "--single-transaction", "-f", below)
    dbs.psql(name, "--single-transaction", "-f", step)
    if target(step) == HEAD:
        expected = head_with_layer(dbs, layer)
    else:
        expected = dbs.fresh("lexpected")
        install_release_with_layer(dbs, expected, layer, target(step))
    assert layer_fingerprint(dbs, name, layer) == layer_fingerprint(dbs, expected, layer)
