// The Node built-ins the tests use, declared here so that the package
// needs no type package beyond typescript.

declare module "node:test" {
  interface TestContext {
    after(fn: () => unknown): void;
    diagnostic(message: string): void;
  }
  type TestFn = (t: TestContext) => unknown;
  export function test(name: string, fn: TestFn): Promise<void>;
  export function test(name: string, opts: { timeout?: number; skip?: boolean | string }, fn: TestFn): Promise<void>;
  export function describe(name: string, fn: () => unknown): void;
  export function before(fn: () => unknown): void;
  export function after(fn: () => unknown): void;
}

declare module "node:assert/strict" {
  interface Assert {
    (value: unknown, message?: string): asserts value;
    ok(value: unknown, message?: string): asserts value;
    equal<T>(actual: unknown, expected: T, message?: string): asserts actual is T;
    notEqual(actual: unknown, expected: unknown, message?: string): void;
    deepEqual<T>(actual: unknown, expected: T, message?: string): asserts actual is T;
    match(value: string, re: RegExp, message?: string): void;
    rejects(fn: Promise<unknown> | (() => Promise<unknown>), expected?: unknown, message?: string): Promise<void>;
    throws(fn: () => unknown, expected?: unknown, message?: string): void;
    fail(message?: string): never;
  }
  const assert: Assert;
  export default assert;
}

declare module "node:child_process" {
  interface Readable {
    on(event: "data", fn: (chunk: { toString(): string }) => void): unknown;
    setEncoding(enc: string): unknown;
  }
  export interface ChildProcess {
    pid?: number;
    exitCode: number | null;
    signalCode: string | null;
    stdout: Readable;
    stderr: Readable;
    kill(signal?: string): boolean;
    on(event: "exit", fn: (code: number | null, signal: string | null) => void): unknown;
    once(event: "exit", fn: (code: number | null, signal: string | null) => void): unknown;
  }
  export function spawn(
    cmd: string,
    args: string[],
    opts?: { env?: Record<string, string | undefined>; stdio?: unknown; cwd?: string },
  ): ChildProcess;
}

declare module "node:fs" {
  export function mkdtempSync(prefix: string): string;
  export function rmSync(path: string, opts?: { recursive?: boolean; force?: boolean }): void;
  export function readFileSync(path: string, enc: "utf8"): string;
  export function existsSync(path: string): boolean;
}

declare module "node:os" {
  export function tmpdir(): string;
}

declare module "node:path" {
  export function join(...parts: string[]): string;
  export function resolve(...parts: string[]): string;
}

declare const __dirname: string;
