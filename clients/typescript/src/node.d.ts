// The few Node built-ins the package uses, declared here so that the
// package needs no type package beyond typescript. None of these types
// appears in the package's public API.

declare const process: {
  pid: number;
  execPath: string;
  exitCode: number | undefined;
  env: Record<string, string | undefined>;
  on(event: "SIGTERM" | "SIGINT", listener: (signal: string) => void): unknown;
  off(event: "SIGTERM" | "SIGINT", listener: (signal: string) => void): unknown;
  exit(code?: number): never;
  emitWarning(warning: string): void;
};

declare module "node:os" {
  export function hostname(): string;
}
