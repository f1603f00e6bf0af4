"""The Client against a real `leasepool serve` over SQLite."""

from __future__ import annotations

import http.server
import threading
import unittest
from datetime import datetime, timedelta, timezone
from typing import Iterator, List, Optional

from support import Proxy, TempStore, closing, free_port, unique, wait_for

from leasepool import Client, Event, LeasepoolError, UnavailableError, go_duration

store: TempStore
client: Client


def setUpModule() -> None:
    global store, client
    store = TempStore()
    try:
        client = Client(store.serve().url)
    except BaseException:
        store.close()
        raise


def tearDownModule() -> None:
    client.close()
    store.close()


def parse_time(s: str) -> datetime:
    # Go writes nanoseconds; fromisoformat takes at most microseconds.
    head, _, frac = s.rstrip("Z").partition(".")
    return datetime.fromisoformat(head + ("." + frac[:6] if frac else "")).replace(tzinfo=timezone.utc)


class PublishTest(unittest.TestCase):
    def test_publish_sends_every_option(self) -> None:
        key, kind = unique("opts"), unique("kind")
        before = datetime.now(timezone.utc)
        res = client.publish(
            key, kind, {"n": 1}, priority=7, delay=timedelta(minutes=10), specific_worker_ids=["w-a", "w-b"],
            concurrent_worker_cnt=2, success_worker_cnt=2, max_unexpected_retries=0,
            ping_interval=0.5, worker_timeout="3s", lock_keys=["db"],
        )
        self.assertEqual(res["result"], "inserted")
        self.assertTrue(res.get("warnings"), "no live worker runs the kind: the server warns")
        t = client.get(key)
        self.assertEqual(t["payload"], {"n": 1})
        self.assertEqual(t["priority"], 7)
        self.assertGreaterEqual(parse_time(t["run_at"]), before + timedelta(minutes=9, seconds=59))
        self.assertEqual(t["specific_worker_ids"], ["w-a", "w-b"])
        self.assertEqual((t["concurrent_worker_cnt"], t["success_worker_cnt"]), (2, 2))
        self.assertEqual(t["max_unexpected_retries"], 0)
        self.assertEqual((t["ping_interval"], t["worker_timeout"]), ("500ms", "3s"))
        self.assertEqual(t["lock_keys"], ["db"])
        self.assertEqual(t["state"], "pending")

    def test_publish_is_idempotent_and_reruns(self) -> None:
        key, kind = unique("idem"), unique("kind")
        self.assertEqual(client.publish(key, kind)["result"], "inserted")
        self.assertEqual(client.publish(key, kind, {"other": True})["result"], "existing")
        self.assertEqual(client.get(key).get("payload"), {}, "an existing task keeps its payload")
        client.cancel(key)
        res = client.publish(key, kind, rerun=True)
        self.assertEqual(res["result"], "rerun")
        self.assertEqual(client.get(key)["state"], "pending")

    def test_publish_debounce_replaces_a_pending_payload(self) -> None:
        key, kind = unique("debounce"), unique("kind")
        first = client.publish(key, kind, {"n": 1}, debounce=60)
        self.assertEqual(first["result"], "inserted")
        second = client.publish(key, kind, {"n": 2}, debounce="1m")
        self.assertEqual(second["result"], "debounced")
        self.assertEqual(client.get(key)["payload"], {"n": 2})
        self.assertGreater(parse_time(second["task"]["run_at"]), parse_time(first["task"]["run_at"]))
        many = client.publish_many([
            {"key": key, "kind": kind, "payload": {"n": 3}, "debounce": timedelta(minutes=1)},
            {"key": key, "kind": kind, "payload": {"n": 4}, "debounce": 0},
        ])
        self.assertEqual((many["debounced"], many["refused"]), (1, 1))
        self.assertTrue(many["results"][1]["error"].startswith("tasks[1].debounce: "), many["results"][1])
        self.assertEqual(client.get(key)["payload"], {"n": 3})
        with self.assertRaises(LeasepoolError) as cm:
            client.publish(unique("bad"), kind, debounce=-1)
        self.assertTrue(str(cm.exception).startswith("debounce: ") or "debounce: " in str(cm.exception), str(cm.exception))

    def test_run_at_datetime(self) -> None:
        key = unique("runat")
        at = datetime.now(timezone.utc).replace(microsecond=0) + timedelta(hours=2)
        client.publish(key, unique("kind"), run_at=at)
        self.assertEqual(parse_time(client.get(key)["run_at"]), at)

    def test_bad_input_is_an_error_naming_the_field(self) -> None:
        key = unique("bad")
        with self.assertRaises(LeasepoolError) as cm:
            client.publish(key, "noop", ping_interval="1ms")
        self.assertEqual(cm.exception.status, 400)
        self.assertTrue(cm.exception.message.startswith("ping_interval:"), cm.exception.message)
        with self.assertRaises(LeasepoolError) as cm:
            client.get(key)
        self.assertEqual(cm.exception.status, 404, "a refused publish writes nothing")

    def test_strict_refuses_a_kind_without_worker(self) -> None:
        key = unique("strict")
        with self.assertRaises(LeasepoolError) as cm:
            client.publish(key, unique("kind"), strict=True)
        self.assertEqual(cm.exception.status, 400)
        self.assertIn("kind", cm.exception.message)

    def test_durations(self) -> None:
        self.assertEqual(go_duration(1.5), "1500ms")
        self.assertEqual(go_duration(timedelta(minutes=2)), "120000ms")
        self.assertEqual(go_duration(0.0000015), "1500ns")
        self.assertEqual(go_duration("10m"), "10m")
        with self.assertRaises(TypeError):
            go_duration(True)


class BatchTest(unittest.TestCase):
    def test_each_item_has_its_outcome_in_order(self) -> None:
        a, b, kind = unique("ba"), unique("bb"), unique("kind")
        res = client.publish_many([
            {"key": a, "kind": kind, "payload": {"i": 0}},
            {"key": a, "kind": kind},
            {"key": b, "kind": ""},
            {"key": b, "kind": kind, "delay": 60},
        ])
        self.assertEqual([r["result"] for r in res["results"]], ["inserted", "existing", "refused", "inserted"])
        self.assertEqual(res["results"][2]["error"], "tasks[2].kind: must not be empty")
        self.assertEqual((res["inserted"], res["existing"], res["refused"], res["failed"]), (2, 1, 1, 0))
        self.assertEqual(client.get(a)["payload"], {"i": 0})
        self.assertGreater(parse_time(client.get(b)["run_at"]), datetime.now(timezone.utc) + timedelta(seconds=50))

    def test_more_than_one_request_of_tasks(self) -> None:
        # 10,000 per request: 10,050 items take two, and an error's index
        # counts from the start of the whole list.
        kind, prefix = unique("kind"), unique("many") + "-"
        items = [{"key": f"{prefix}{i:05d}", "kind": kind} for i in range(10_050)]
        items[10_020] = {"key": f"{prefix}bad", "kind": kind, "ping_interval": "1ms"}
        res = client.publish_many(items)
        self.assertEqual(len(res["results"]), 10_050)
        self.assertEqual((res["inserted"], res["refused"]), (10_049, 1))
        self.assertTrue(res["results"][10_020]["error"].startswith("tasks[10020].ping_interval:"), res["results"][10_020])
        self.assertEqual(res["results"][10_049]["key"], f"{prefix}10049")
        self.assertEqual(sum(1 for _ in client.iter_tasks(key_prefix=prefix)), 10_049)

    def test_unknown_field_is_refused_before_sending(self) -> None:
        key = unique("unk")
        with self.assertRaises(ValueError) as cm:
            client.publish_many([{"key": key, "kind": "k"}, {"key": key, "kind": "k", "prio": 1}])
        self.assertIn("tasks[1].prio", str(cm.exception))
        with self.assertRaises(LeasepoolError):
            client.get(key)


class ReadTest(unittest.TestCase):
    def test_list_filters_and_cursors(self) -> None:
        kind, prefix = unique("kind"), unique("ls") + "-"
        keys = [f"{prefix}{i}" for i in range(7)]
        # One by one: a batch's items of different keys take publish
        # sequence numbers in no promised order.
        for i, k in enumerate(keys):
            client.publish(k, kind, {"even": i % 2 == 0})
        client.cancel(keys[3])
        page = client.list(kind=kind, limit=3)
        self.assertEqual([t["key"] for t in page["tasks"]], keys[::-1][:3], "newest first")
        self.assertNotIn("prev_cursor", page)
        nxt = client.list(kind=kind, limit=3, cursor=page["next_cursor"])
        self.assertEqual([t["key"] for t in nxt["tasks"]], keys[::-1][3:6])
        back = client.list(kind=kind, limit=3, cursor=nxt["prev_cursor"])
        self.assertEqual([t["key"] for t in back["tasks"]], keys[::-1][:3])
        walked = [t["key"] for t in client.iter_tasks(kind=kind, order="asc", page_size=2)]
        self.assertEqual(walked, keys)
        self.assertEqual([t["key"] for t in client.iter_tasks(kind=kind, state="cancelled")], [keys[3]])
        self.assertEqual(len(list(client.iter_tasks(key_prefix=prefix, text='"even":true'))), 4)
        future = datetime.now(timezone.utc) + timedelta(hours=1)
        self.assertEqual(client.list(kind=kind, created_after=future)["tasks"], [])
        with self.assertRaises(TypeError):
            list(client.iter_tasks(knd=kind))
        with self.assertRaises(LeasepoolError) as cm:
            client.list(state="nonsense")
        self.assertEqual(cm.exception.status, 400)

    def test_get_missing_and_escaped_keys(self) -> None:
        with self.assertRaises(LeasepoolError) as cm:
            client.get(unique("missing"))
        self.assertEqual((cm.exception.status, cm.exception.message), (404, "task not found"))
        key = unique("a/b c?d#e%")
        client.publish(key, unique("kind"))
        self.assertEqual(client.get(key)["key"], key)
        self.assertEqual(client.cancel(key)["state"], "cancelled")

    def test_cancel_and_retry(self) -> None:
        key = unique("cr")
        client.publish(key, unique("kind"))
        self.assertEqual(client.cancel(key)["state"], "cancelled")
        with self.assertRaises(LeasepoolError) as cm:
            client.cancel(key)
        self.assertEqual(cm.exception.status, 409)
        self.assertEqual(client.retry(key)["state"], "pending")
        with self.assertRaises(LeasepoolError) as cm:
            client.retry(key)
        self.assertEqual(cm.exception.status, 409)


class Follower:
    """Reads an event iterator in a thread, keeping every event."""

    def __init__(self, it: Iterator[Event]) -> None:
        self.it = it
        self.events: List[Event] = []
        self.error: Optional[BaseException] = None
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self) -> None:
        try:
            for ev in self.it:
                self.events.append(ev)
        except BaseException as e:  # kept for the test to assert on
            self.error = e

    def keys(self) -> List[str]:
        return [e["key"] for e in self.events]

    def prime(self, kind: str) -> str:
        """Publish new tasks of ``kind`` until the stream shows one: it is
        open then, and every later event reaches it. Answers that key."""
        def seen() -> Optional[str]:
            if self.events:
                return self.events[0]["key"]
            client.publish(unique("prime"), kind)
            return None
        return str(wait_for(seen, "the event stream to open", every=0.1))


class ServersTest(unittest.TestCase):
    def test_a_refused_server_moves_calls_to_the_next(self) -> None:
        live = store.servers[0].url
        dead = f"http://127.0.0.1:{free_port()}"
        c = closing(self, Client(f"{dead},{live}"))
        key = unique("rot")
        self.assertEqual(c.publish(key, unique("kind"))["result"], "inserted")
        self.assertEqual(c.url, live)
        self.assertEqual(c.get(key)["key"], key)
        with self.assertRaises(UnavailableError) as cm:
            closing(self, Client([dead])).get(key)
        self.assertEqual((cm.exception.status, cm.exception.code), (0, "unavailable"))
        self.assertIn(dead, cm.exception.message)

    def test_bad_urls_are_refused(self) -> None:
        for url in ("ftp://x", "http://", "", " , "):
            with self.assertRaises(ValueError) as cm:
                Client(url)
            self.assertTrue(str(cm.exception).startswith("url:"), cm.exception)

    def test_a_token_is_sent(self) -> None:
        s = TempStore()
        self.addCleanup(s.close)
        srv = s.serve("--token", "s3cret")
        with self.assertRaises(LeasepoolError) as cm:
            closing(self, Client(srv.url)).stats()
        self.assertEqual(cm.exception.status, 401)
        self.assertIn("by_state", closing(self, Client(srv.url, token="s3cret")).stats())


class EventsTest(unittest.TestCase):
    def test_follow_filter_and_resume(self) -> None:
        kind, key = unique("evk"), unique("ev")
        f = Follower(client.events(kind=kind))
        f.prime(kind)
        client.publish(unique("other"), unique("kind"))  # another kind: filtered out
        client.publish(key, kind)
        client.cancel(key)
        wait_for(lambda: ("cancelled", key) in [(e["event"], e["key"]) for e in f.events], "the cancelled event")
        self.assertTrue(all(e["kind"] == kind for e in f.events), f.events)
        mine = [e for e in f.events if e["key"] == key]
        self.assertEqual([e["event"] for e in mine], ["published", "cancelled"])
        self.assertEqual([e["state"] for e in mine], ["pending", "cancelled"])
        resumed = client.events(since=mine[0]["token"], kind=kind)
        self.assertEqual(next(resumed)["token"], mine[1]["token"], "since resumes right after its event")
        resumed.close()
        typed = client.events(since=f.events[0]["token"], kind=kind, type=["cancelled"])
        self.assertEqual((next(typed)["event"], f.events[-1]["key"]), ("cancelled", key))
        typed.close()

    def test_reconnects_from_last_id_after_a_drop(self) -> None:
        proxy = Proxy(store.servers[0].port)
        self.addCleanup(proxy.close)
        kind = unique("drop")
        f = Follower(closing(self, Client(proxy.url)).events(kind=kind, read_timeout=5))
        f.prime(kind)
        proxy.close()  # the stream drops, and reconnecting fails for a while
        k2, k3 = unique("d2"), unique("d3")
        client.publish(k2, kind)
        client.publish(k3, kind)
        proxy.open()
        wait_for(lambda: k3 in f.keys(), "the events published while the stream was down")
        keys = f.keys()
        self.assertEqual(len(keys), len(set(keys)), f"an event came twice: {keys}")
        self.assertEqual(keys[-2:], [k2, k3])
        self.assertGreaterEqual(proxy.accepted, 2, "the stream reconnected")
        self.assertIsNone(f.error)

    def test_no_reconnect_raises(self) -> None:
        proxy = Proxy(store.servers[0].port)
        kind = unique("norec")
        f = Follower(closing(self, Client(proxy.url)).events(kind=kind, reconnect=False))
        f.prime(kind)
        proxy.close()
        err = wait_for(lambda: f.error, "the stream to end")
        self.assertIsInstance(err, UnavailableError)

    def test_closing_the_client_ends_its_streams(self) -> None:
        kind = unique("close")
        c = Client(store.servers[0].url)
        f = Follower(c.events(kind=kind))
        f.prime(kind)
        c.close()
        f.thread.join(10)
        self.assertFalse(f.thread.is_alive(), "the stream ended")
        self.assertIsNone(f.error)
        self.assertEqual(c.get(f.events[0]["key"])["kind"], kind, "the client works on after close")
        c.close()

    def test_bad_since_is_a_400(self) -> None:
        with self.assertRaises(LeasepoolError) as cm:
            next(client.events(since="!!"))
        self.assertEqual(cm.exception.status, 400)


class StreamWireTest(unittest.TestCase):
    """The end of a stream that only a store losing its history sends, as
    docs/http-api.md gives it on the wire, from a plain HTTP server."""

    def test_history_lost_ends_the_stream(self) -> None:
        body = (b"id: MA\n\n: heartbeat\n\nid: MQ\ndata: {\"event\":\"published\",\"key\":\"n1\",\n"
                b"data: \"kind\":\"noop\",\"token\":\"MQ\"}\n\n"
                b"event: error\ndata: {\"error\":\"history_lost\"}\n\n")
        asked: List[str] = []

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                asked.append(self.path)
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=srv.serve_forever, daemon=True).start()
        self.addCleanup(srv.server_close)
        self.addCleanup(srv.shutdown)
        it = closing(self, Client(f"http://127.0.0.1:{srv.server_address[1]}")).events(kind="noop")
        ev = next(it)
        self.assertEqual((ev["event"], ev["key"], ev["kind"]), ("published", "n1", "noop"), "data lines joined")
        with self.assertRaises(LeasepoolError) as cm:
            next(it)
        self.assertEqual((cm.exception.status, cm.exception.code), (410, "history_lost"))
        self.assertEqual(asked, ["/api/v1/events?kind=noop"], "no reconnect after history_lost")


if __name__ == "__main__":
    unittest.main()
