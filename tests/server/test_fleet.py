"""Fleet (pure): which server gets the next request, taking servers out and probing them back in."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gen_pipeline.records import LoadSnapshot
from gen_pipeline.server.fleet import Fleet
from gen_pipeline.server.fleet_watch import _urls_in
from gen_pipeline.server.hang import HangWatch

A, B, C = "http://a", "http://b", "http://c"


def snap(used: int | None, running: int = 0) -> LoadSnapshot:
    return LoadSnapshot(t_s=0.0, running=running, queued=0, used_tokens=used, token_usage=None)


def fleet_with(totals: dict[str, int | None], used: dict[str, int | None], **kw) -> Fleet:
    f = Fleet(list(totals), **kw)
    for url, total in totals.items():
        f.set_capacity(url, total)
    f.update({u: snap(v) for u, v in used.items()})
    return f


@pytest.mark.parametrize("totals, used, expected", [
    ({A: 1000, B: 1000, C: 1000}, {A: 900, B: 100, C: 500}, B),  # most free KV
    ({A: 1000, B: 4000, C: 1000}, {A: 0, B: 2000, C: 0}, B),  # a bigger server with more free tokens
    ({A: 1000, B: 1000, C: 1000}, {A: 300, B: 300, C: 300}, A),  # ties: list order
    ({A: 1000, B: None, C: 1000}, {A: 0, B: 0, C: 900}, A),  # one capacity unknown: fewest in flight (all 0)
    ({A: 1000, B: 1000, C: 1000}, {A: 0, B: None, C: 900}, A),  # one load unknown: fewest in flight
])
def test_pick_most_free_kv(totals, used, expected):
    assert fleet_with(totals, used).pick() == expected


def test_requests_sent_since_the_poll_count_against_a_server():
    f = fleet_with({A: 10_000, B: 10_000}, {A: 0, B: 2_000}, tokens_per_request=1_000)
    picks = []
    for _ in range(6):
        url = f.pick()
        f.started(url)
        picks.append(url)
    # A starts 2,000 tokens freer: it takes requests until they are level, then they alternate
    assert picks == [A, A, A, B, A, B]
    assert (f.free_tokens(A), f.free_tokens(B)) == (6_000, 6_000)
    f.update({A: snap(4_000), B: snap(2_000)})  # the poll now sees what was sent: nothing is counted twice
    assert (f.free_tokens(A), f.free_tokens(B)) == (6_000, 8_000) and f.pick() == B


def test_without_token_figures_fewest_in_flight():
    f = Fleet([A, B, C])
    for url in (A, A, B):
        f.started(url)
    assert f.pick() == C
    f.started(C)
    f.started(C)
    f.finished(A)
    assert f.pick() == A


@pytest.mark.parametrize("events, up, taken_out", [
    (["fail A", "fail A"], [A, B, C], 0),  # two errors: still in
    (["fail A", "fail A", "fail A"], [B, C], 1),  # the third in a row takes it out
    (["fail A", "fail A", "ok A", "fail A", "fail A"], [A, B, C], 0),  # an answer restarts the count
    (["fail A"] * 3 + ["ok A"], [A, B, C], 1),  # a down server that answers is back
    (["fail A"] * 3 + ["fail B"] * 3 + ["fail C"] * 3, [], 3),
])
def test_taken_out_after_failures_in_a_row(events, up, taken_out):
    f = Fleet([A, B, C], fail_after=3)
    for event in events:
        what, name = event.split()
        url = {"A": A, "B": B, "C": C}[name]
        f.failed(url, 0.0) if what == "fail" else f.succeeded(url)
    assert (f.up_urls, f.taken_out) == (up, taken_out)


def test_down_servers_are_not_picked_and_their_load_is_forgotten():
    f = fleet_with({A: 1000, B: 1000}, {A: 0, B: 500})
    version = f.version
    f.mark_down(A, now_s=0.0)
    assert f.pick() == B and f.free_tokens(A) is None and f.version == version + 1
    f.mark_up(A)
    assert f.up_urls == [A, B] and f.version == version + 2


def test_all_down_picks_the_next_to_be_probed():
    f = Fleet([A, B], probe_initial_s=1.0)
    f.mark_down(A, now_s=5.0)
    f.mark_down(B, now_s=3.0)
    assert f.pick() == B


def test_probes_back_off_exponentially_up_to_a_ceiling():
    f = Fleet([A, B], probe_initial_s=1.0, probe_max_s=8.0)
    f.mark_down(A, now_s=0.0)
    due_at, now_s = [], 0.0
    while len(due_at) < 6:
        now_s += 0.5
        if f.due_probes(now_s) == [A]:
            due_at.append(now_s)
            f.probe_failed(A, now_s)
    assert due_at == [1.0, 3.0, 7.0, 15.0, 23.0, 31.0]  # waits 1, 2, 4, 8, 8, 8 s
    f.mark_up(A)
    assert f.due_probes(100.0) == []
    f.mark_down(A, now_s=100.0)  # out again: the backoff starts over
    assert f.due_probes(100.5) == [] and f.due_probes(101.0) == [A]


def test_update_ignores_unknown_urls_and_a_missing_answer_drops_the_figure():
    f = fleet_with({A: 1000, B: 1000}, {A: 100, B: 900})
    f.update({A: None, "http://elsewhere": snap(0)})
    assert f.free_tokens(A) is None and f.pick() == A  # no token figure for A: fewest in flight


@pytest.mark.parametrize("urls, routing, message", [
    ([], "affinity", "^a fleet needs at least one URL$"),
    ([A], "sticky", r"^routing must be one of affinity, free-kv \(got 'sticky'\)$"),
])
def test_an_empty_fleet_or_an_unknown_routing_is_refused(urls, routing, message):
    with pytest.raises(ValueError, match=message):
        Fleet(urls, routing=routing)


@pytest.mark.parametrize("body, expected", [
    # sglang-router 0.3 GET /workers: a dead worker stays listed with is_healthy false
    ({"workers": [{"url": "http://w1:1", "is_healthy": True}, {"url": "http://w2:2/", "is_healthy": False},
                  {"url": "http://w3:3"}], "total": 3}, ["http://w1:1", "http://w3:3"]),
    ({"urls": ["http://w1:1", "http://w2:2"]}, ["http://w1:1", "http://w2:2"]),  # older routers
    (["http://w1:1", "not a url", 7], ["http://w1:1"]),
    ({"workers": "none"}, []),
    (None, []),
])
def test_router_worker_lists(body, expected):
    assert _urls_in(body) == expected


def test_the_routers_error_for_a_dead_worker_is_retried():
    """sglang-router 0.3.2's answer while a worker it still routes to is dead (captured from the binary)."""
    from gen_pipeline.http import Reply
    from gen_pipeline.run.wire import Retryable, classify_status
    body = (b'{"error":{"type":"Internal Server Error","code":"call_upstream_request_error","message":"error '
            b'sending request for url (http://127.0.0.1:51175/v1/chat/completions). URL: '
            b'http://127.0.0.1:51175/v1/chat/completions"}}')
    with pytest.raises(Retryable) as e:
        classify_status(Reply("http://router/v1/chat/completions", 500, "application/json", body))
    assert e.value.reason == "http_500" and str(e.value).startswith("error sending request for url (http://127.0.0.1")


# ------------------------------------------------------------ conversation affinity

S1, S2 = ("B1", "s1"), ("B1", "s2")


def test_a_first_turn_goes_by_free_kv_and_later_turns_stay_on_its_server():
    f = fleet_with({A: 10_000, B: 10_000, C: 10_000}, {A: 5_000, B: 1_000, C: 3_000}, tokens_per_request=500)
    assert f.pick(S1) == B  # the first turn: most free KV
    f.update({A: snap(1_000), B: snap(2_000), C: snap(3_000)})  # A is now the freest, B 1,000 behind
    assert f.pick() == A and f.pick(S2) == A  # a new sample (and no sample) go by free KV
    assert f.pick(S1) == B  # S1's next turn goes back to B: its history is cached there
    assert (f.stayed, f.moved, f.samples_tracked) == (1, 0, 2)


@pytest.mark.parametrize("used_b, expected, why", [
    (4_400, B, "B has 2,400 fewer free than A, within 25 % of its 10,000"),
    (4_500, B, "exactly the margin"),
    (4_600, A, "past the margin: by free KV"),
    (9_900, A, "B nearly full"),
])
def test_a_later_turn_leaves_an_overloaded_server(used_b, expected, why):
    f = fleet_with({A: 10_000, B: 10_000}, {A: 5_000, B: 0})
    assert f.pick(S1) == B
    f.update({A: snap(2_000), B: snap(used_b)})
    assert f.pick(S1) == expected, why
    assert f.pick(S1) == expected  # the sample follows its turn: the next one stays there


def test_a_later_turn_leaves_a_server_that_is_out_and_does_not_return_to_it():
    f = fleet_with({A: 10_000, B: 10_000}, {A: 5_000, B: 0})
    assert f.pick(S1) == B
    f.mark_down(B, now_s=0.0)
    assert f.pick(S1) == A and (f.stayed, f.moved) == (0, 1)
    f.mark_up(B)
    f.update({A: snap(2_000), B: snap(0)})
    assert f.pick(S1) == A  # A now holds its history, and is within the margin of B


def test_without_token_figures_a_later_turn_stays_unless_far_busier_than_the_least():
    f = Fleet([A, B])
    assert f.pick(S1) == A
    for _ in range(6):
        f.started(A)  # A: 6 in flight, B: 0 → 6 > (1 + 0.25) x 0 + 2: by the fewest in flight
    assert f.pick(S1) == B
    for _ in range(8):
        f.started(A)
    for _ in range(10):
        f.started(B)  # A: 14, B: 10 → 14 <= 1.25 x 10 + 2
    assert f.pick(S1) == B
    assert f.pick(S2) == B  # a first turn: the fewest in flight


def test_an_ended_sample_is_forgotten_and_free_kv_routing_keeps_nothing():
    f = fleet_with({A: 10_000, B: 10_000}, {A: 5_000, B: 0})
    assert f.pick(S1) == B
    f.sample_ended(S1)
    f.sample_ended(S1)  # twice (a cancelled sample) is harmless
    assert f.samples_tracked == 0
    f.update({A: snap(0), B: snap(2_000)})
    assert f.pick(S1) == A  # a first turn again
    plain = fleet_with({A: 10_000, B: 10_000}, {A: 5_000, B: 0}, routing="free-kv")
    assert plain.pick(S1) == B
    plain.update({A: snap(0), B: snap(2_000)})
    assert plain.pick(S1) == A and plain.samples_tracked == 0


URLS = [A, B, C]
_ops = st.lists(st.one_of(
    st.tuples(st.just("pick"), st.integers(0, 5)),  # a turn of sample n (5: a request of no sample)
    st.tuples(st.just("end"), st.integers(0, 4)),
    st.tuples(st.just("finish"), st.integers(0, 2)),
    st.tuples(st.just("down"), st.integers(0, 2)),
    st.tuples(st.just("up"), st.integers(0, 2)),
    st.tuples(st.just("poll"), st.lists(st.one_of(st.none(), st.integers(0, 12_000)), min_size=3, max_size=3)),
), max_size=60)


@settings(max_examples=200, deadline=None)
@given(ops=_ops, totals=st.lists(st.one_of(st.none(), st.integers(1_000, 10_000)), min_size=3, max_size=3),
       margin=st.floats(0.0, 1.0))
def test_affinity_invariants(ops, totals, margin):
    """Whatever the loads: a pick is an up server (any up); a turn that does not go where free-KV routing
    would is its sample's previous turn's server, up and within the margin; state only for live samples."""
    f = Fleet(URLS, tokens_per_request=700, affinity_margin=margin)
    plain = Fleet(URLS, tokens_per_request=700, routing="free-kv")
    for url, total in zip(URLS, totals, strict=True):
        f.set_capacity(url, total)
        plain.set_capacity(url, total)
    previous: dict[int, str] = {}
    for op, arg in ops:
        if op == "pick":
            sample = None if arg == 5 else ("D", str(arg))
            best = plain.pick()
            url = f.pick(sample)
            if f.up_urls:
                assert f.is_up(url)
            if url != best:
                assert sample is not None and previous.get(arg) == url
                known = all(f.free_tokens(u) is not None for u in f.up_urls)
                if known:
                    free, free_best = f.free_tokens(url), f.free_tokens(best)
                    assert free is not None and free_best is not None and totals[URLS.index(url)] is not None
                    assert free >= free_best - margin * totals[URLS.index(url)] - 1e-6
            if sample is not None:
                previous[arg] = url
            f.started(url)
            plain.started(url)
        elif op == "end":
            f.sample_ended(("D", str(arg)))
            previous.pop(arg, None)
        elif op == "finish":
            f.finished(URLS[arg])
            plain.finished(URLS[arg])
        elif op in ("down", "up"):
            for fleet in (f, plain):
                fleet.mark_down(URLS[arg], 0.0) if op == "down" else fleet.mark_up(URLS[arg])
        else:
            loads = {u: snap(v) for u, v in zip(URLS, arg, strict=True)}
            f.update(loads)
            plain.update(loads)
        assert f.samples_tracked == len(previous)  # one entry per sample picked and not ended
    for n in range(5):
        f.sample_ended(("D", str(n)))
    assert f.samples_tracked == 0


# ---------------------------------------------------------------- hung or busy (server/hang.py)

def test_a_silent_server_is_frozen_only_once_a_probe_sent_in_its_silence_goes_unanswered():
    w = HangWatch(5.0)  # probes from 1 s of silence, 3 s each
    assert not w.due(A, 10.0, 0.9, in_flight=4) and not w.due(A, 10.0, 3.0, in_flight=0)  # not silent / idle
    assert w.due(A, 10.0, 1.0, in_flight=4)
    w.sent(A, 10.0)
    assert not w.due(A, 10.5, 1.5, in_flight=4)  # one at a time
    assert w.frozen(A, 15.0, 6.0, in_flight=4) is None  # silent 6 s, but its probe has not failed (yet)
    w.unanswered(A, 10.0, "no answer to GET /v1/models within 3 s")
    assert w.frozen(A, 13.5, 4.5, in_flight=4) is None  # not silent long enough
    assert w.frozen(A, 15.0, 6.0, in_flight=0) is None  # nothing in flight: nothing to re-send
    assert w.frozen(A, 15.0, 6.0, in_flight=4) == "no answer to GET /v1/models within 3 s"
    # progress at 12 s (a stream byte): the probe sent at 10 s predates the silence, whatever it got
    assert w.frozen(A, 17.5, 5.5, in_flight=4) is None
    w.answered(A)  # a later probe answered: alive, only busy
    assert w.frozen(A, 15.0, 6.0, in_flight=4) is None
    assert not w.due(A, 10.9, 2.0, in_flight=4) and w.due(A, 11.0, 2.0, in_flight=4)  # one a second


def test_a_hang_timeout_below_the_probe_timeout_shortens_the_probe():
    w = HangWatch(1.0)
    assert (w.probe_after_s, w.probe_timeout_s) == (0.2, 0.6)
    assert HangWatch().hang_after_s == 5.0 and HangWatch().probe_timeout_s == 3.0


def test_an_answers_headers_do_not_restart_the_count_of_failed_health_checks():
    """A stuck scheduler's HTTP side still answers new requests with headers (SGLang: the stream starts,
    no token comes). Those restart the count of connection errors, not of failed health checks: three 503s
    in a row take it out however many headers came between them. Progress or /health 200 restarts it."""
    f = Fleet([A, B], fail_after=3)
    for t in (1.0, 2.0):
        assert not f.failed(A, t, health=True)
        f.succeeded(A)  # a new request's headers
    assert f.failed(A, 3.0, health=True) and not f.is_up(A)
    f.succeeded(A)  # the headers of a request sent before: still out (it would never leave the fleet again)
    assert not f.is_up(A)
    f.answered(A, 3.5)  # /health 200 (FleetWatch.health notes it as progress, then succeeded): back
    f.succeeded(A)
    assert f.is_up(A)

    f = Fleet([A, B], fail_after=3)
    f.failed(A, 1.0, health=True)
    f.failed(A, 2.0, health=True)
    f.answered(A, 2.5)  # a token came: not stuck
    assert not f.failed(A, 3.0, health=True) and f.is_up(A)
    f.failed(A, 4.0, health=True)
    f.answered(A, 4.5)  # /health 200
    f.succeeded(A)
    assert not f.failed(A, 5.0, health=True) and f.is_up(A)
    f.failed(A, 6.0)  # connection errors count on their own
    f.failed(A, 7.0)
    assert f.failed(A, 8.0) and not f.is_up(A)
