export { Client, MAX_BATCH_TASKS, MAX_BATCH_BYTES } from "./client.js";
export type { ClientOptions, PublishOptions, PublishManyOptions } from "./client.js";
export { LeasepoolError, SnoozeError, RetryableError } from "./errors.js";
export type { ConnectionOptions } from "./transport.js";
export * from "./types.js";
export { Worker } from "./worker.js";
export type { Job, FlowStep, Handler, WorkerOptions, WorkerLogger, StartOptions, AbortReason } from "./worker.js";
