// The few Node built-ins the package uses, declared here so that the
// package needs no type package beyond typescript. None of these types
// appears in the package's public API.

declare const process: {
  pid: number;
  execPath: string;
  exitCode: number | undefined;
  env: Record<string, string | undefined>;
  on(event: "SIGTERM" | "SIGINT", listener: (signal: string) => void): unknown;
  on(event: "exit", listener: (code: number) => void): unknown;
  off(event: "SIGTERM" | "SIGINT", listener: (signal: string) => void): unknown;
  exit(code?: number): never;
  emitWarning(warning: string): void;
};

declare module "node:os" {
  export function hostname(): string;
}

declare module "node:http" {
  export interface IncomingMessage extends AsyncIterable<Uint8Array> {
    statusCode?: number;
    headers: Record<string, string | string[] | undefined>;
    destroy(error?: Error): void;
    resume(): void;
  }
  export interface ClientRequest {
    on(event: "error", listener: (err: Error) => void): this;
    end(body?: string): void;
    destroy(error?: Error): void;
  }
  export interface RequestOptions {
    method?: string;
    headers?: Record<string, string | number>;
    agent?: Agent;
    signal?: AbortSignal;
  }
  export class Agent {
    constructor(opts?: { keepAlive?: boolean; timeout?: number; maxSockets?: number });
    destroy(): void;
  }
  export function request(url: URL, opts: RequestOptions, callback: (res: IncomingMessage) => void): ClientRequest;
}

declare module "node:https" {
  import type { ClientRequest, IncomingMessage, RequestOptions } from "node:http";
  export class Agent {
    constructor(opts?: { keepAlive?: boolean; timeout?: number; maxSockets?: number });
    destroy(): void;
  }
  export function request(url: URL, opts: Omit<RequestOptions, "agent"> & { agent?: Agent }, callback: (res: IncomingMessage) => void): ClientRequest;
}
