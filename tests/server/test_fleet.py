"""Fleet (pure): which server gets the next request, taking servers out and probing them back in."""

from __future__ import annotations

import pytest

from gen_pipeline.records import LoadSnapshot
from gen_pipeline.server.fleet import Fleet

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


def test_an_empty_fleet_is_refused():
    with pytest.raises(ValueError):
        Fleet([])


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
    from gen_pipeline.server.fleet_watch import _urls_in
    assert _urls_in(body) == expected


def test_the_routers_error_for_a_dead_worker_is_retried():
    """sglang-router 0.3.2's answer while a worker it still routes to is dead (captured from the binary)."""
    from gen_pipeline.http import Reply
    from gen_pipeline.run.chat import _Retryable, classify_status
    body = (b'{"error":{"type":"Internal Server Error","code":"call_upstream_request_error","message":"error '
            b'sending request for url (http://127.0.0.1:51175/v1/chat/completions). URL: '
            b'http://127.0.0.1:51175/v1/chat/completions"}}')
    with pytest.raises(_Retryable) as e:
        classify_status(Reply("http://router/v1/chat/completions", 500, "application/json", body))
    assert e.value.reason == "http_500" and str(e.value).startswith("error sending request for url (http://127.0.0.1")
