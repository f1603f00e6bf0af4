import { test } from "node:test";
import assert from "node:assert/strict";
import { SseParser } from "../src/sse.js";

test("the SSE parser joins data lines, keeps the last id, splits on any line end", () => {
  const p = new SseParser("start");
  const got = [
    ...p.push("id: MA\n\n: heartbeat\n\nid: MQ\r\ndata: {\"a\":"),
    ...p.push("1}\r\ndata: x\r"),
    ...p.push("\n\r\nevent: error\ndata: {\"error\":\"history_lost\"}\n\n"),
  ];
  assert.deepEqual(
    got.map((m) => [m.event, m.data, m.lastId, m.hasId, m.hasData]),
    [
      ["message", "", "MA", true, false],
      ["message", '{"a":1}\nx', "MQ", true, true],
      ["error", '{"error":"history_lost"}', "MQ", false, true],
    ],
  );
  assert.equal(p.lastId, "MQ");
  assert.deepEqual(p.push("data: cut"), [], "an unfinished message waits for its blank line");
});
