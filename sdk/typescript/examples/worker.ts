// The README's example worker: a queue worker the operator manages (checked by `tsc`).
import {
  Admin,
  ConfigState,
  FileWatcher,
  Gate,
  Metrics,
  type Outcome,
  TokenReviewVerifier,
  controllerFromConfig,
  defaultWorkerConfig,
  serviceAccountUsername,
} from "@backpressure-dev/worker";

/** Your queue client: receive up to `max` messages; ack or nack each. */
interface Queue<M> {
  receive(max: number): Promise<M[]>;
  ack(message: M): Promise<void>;
  nack(message: M): Promise<void>;
}

export async function run<M>(queue: Queue<M>, handle: (m: M) => Promise<Outcome>) {
  const workload = process.env.BP_WORKLOAD ?? "export-worker";
  const namespace = process.env.BP_NAMESPACE ?? "default";
  const metrics = new Metrics(workload);
  const config = defaultWorkerConfig();
  const gate = new Gate(controllerFromConfig(config, 42), { metrics });
  const state = new ConfigState(gate, config, { metrics });
  const operator = serviceAccountUsername("backpressure-system", "backpressure-operator");
  const verifier = TokenReviewVerifier.forWorkload(namespace, workload); // in-cluster
  await new Admin(state, { metrics, verifier, allowed: [operator] }).listen(9464);
  new FileWatcher(state, "/etc/backpressure/worker-config.json").start();

  for (;;) {
    const permit = await gate.acquire(10); // waits while the controller backs off
    const messages = await queue.receive(permit.granted);
    const started = messages.map((m) => ({ m, slot: permit.start() }));
    permit.release(); // the permits the poll did not use go back
    for (const { m, slot } of started) {
      void handle(m).then(
        async (outcome) => {
          slot.finish(outcome); // "success" | "dependency_failure" | "message_failure"
          await (outcome === "success" ? queue.ack(m) : queue.nack(m));
        },
        async () => {
          slot.abandon(); // the handler threw: free the slot, record nothing
          await queue.nack(m);
        },
      );
    }
  }
}
