import { spawn, type ChildProcess } from "node:child_process";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";

/** The leasepool binary the tests run (scripts/test sets it). */
export function leasepoolBin(): string {
  const bin = process.env.LEASEPOOL_BIN;
  if (!bin) throw new Error("LEASEPOOL_BIN: set it to a leasepool binary (scripts/test builds one)");
  return bin;
}

export interface Serve {
  url: string;
  db: string;
  proc: ChildProcess;
  /** stderr so far, for a failing test's message. */
  log(): string;
  stop(signal?: string): Promise<void>;
}

/** A temporary directory, removed when the process exits. */
export function tempDir(): string {
  const dir = mkdtempSync(join(tmpdir(), "leasepool-ts-"));
  cleanups.push(() => rmSync(dir, { recursive: true, force: true }));
  return dir;
}
const cleanups: (() => void)[] = [];
export function cleanup(): void {
  for (const c of cleanups.splice(0)) c();
}

/**
 * Starts `leasepool serve` on a port the kernel picks and answers once it
 * says where it listens. db defaults to a new SQLite file.
 */
export async function startServe(opts: { db?: string; args?: string[]; env?: Record<string, string> } = {}): Promise<Serve> {
  const db = opts.db ?? join(tempDir(), "x.db");
  const proc = spawn(leasepoolBin(), ["serve", "--store", `sqlite:${db}`, "--listen", "127.0.0.1:0", ...(opts.args ?? [])], {
    env: { ...process.env, LEASEPOOL_TOKEN: undefined, ...opts.env },
    stdio: ["ignore", "pipe", "pipe"],
  });
  let stderr = "";
  const exited = new Promise<void>((resolve) => proc.once("exit", () => resolve()));
  const url = await new Promise<string>((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`serve did not say where it listens within 15 s:\n${stderr}`)), 15000);
    proc.stderr.on("data", (chunk) => {
      stderr += chunk.toString();
      for (const line of stderr.split("\n")) {
        if (!line.startsWith("{")) continue;
        try {
          const rec = JSON.parse(line) as { msg?: string; url?: string };
          if (rec.url && /serving/.test(rec.msg ?? "")) {
            clearTimeout(timer);
            resolve(rec.url.replace(/\/+$/, ""));
          }
        } catch {
          // a line cut in the middle: the next chunk completes it
        }
      }
    });
    proc.once("exit", (code) => {
      clearTimeout(timer);
      reject(new Error(`serve exited (${code}) before listening:\n${stderr}`));
    });
  });
  return {
    url,
    db,
    proc,
    log: () => stderr,
    stop: async (signal = "SIGTERM") => {
      if (proc.exitCode === null && proc.signalCode === null) proc.kill(signal);
      await exited;
    },
  };
}

/**
 * Polls check until it answers something other than undefined, and
 * answers that; fails with what the last check saw after timeoutMs.
 */
export async function waitFor<T>(what: string, check: () => Promise<T | undefined> | T | undefined, timeoutMs = 15000): Promise<T> {
  const deadline = Date.now() + timeoutMs;
  let last: unknown;
  for (;;) {
    try {
      const v = await check();
      if (v !== undefined) return v;
    } catch (err) {
      last = err;
    }
    if (Date.now() > deadline) throw new Error(`timed out after ${timeoutMs} ms waiting for ${what}${last ? `: ${String(last)}` : ""}`);
    await new Promise((r) => setTimeout(r, 25));
  }
}

let seq = 0;
/** A name no other test uses. */
export function unique(prefix: string): string {
  return `${prefix}-${process.pid}-${++seq}`;
}
