"""`zeroscale demo`: start everything on loopback, run the scenario under the live view, print the summary.

Order: local scaler and the web app's port, Redis (and Kafka), proxy, adapter, then the HPA loop
and the sampler; the scenario runs; everything is stopped in reverse, also on Ctrl-C or an error.
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys
import tempfile
import time
from pathlib import Path

from adapter.argtypes import whole_number
from adapter.children import ChildFailed, shared_port
from adapter.demo import jaeger
from adapter.demo.autoscaler import LocalHPA, Reading, Timing, hpa_manifests, load_hpas, run_hpas
from adapter.demo.observe import sample_forever
from adapter.demo.processes import Supervisor
from adapter.demo.report import Summary, summarize, summary_lines, write_report
from adapter.demo.scaler import start_scaler
from adapter.demo.scenario import PLANS, Plan, Scenario
from adapter.demo.stack import (
    HOST,
    JOBS_DONE_KEY,
    JOBS_KEY,
    KAFKA_GROUP,
    KAFKA_TOPIC,
    Ports,
    StackError,
    start_jaeger,
    start_kafka,
    start_redis,
    start_zeroscale,
)
from adapter.demo.timeline import ScaleEvent, Timeline
from adapter.demo.view import View
from adapter.demo.workloads import LocalWorkload
from adapter.hpa.fetch import adapter_client
from adapter.kube.client import KubeClient

_FIRST_READ_WAIT = 30.0
_VIEW_TICK = 0.25


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--scenario", choices=sorted(PLANS), default="full", help="full (about 45 s) or smoke (about 20 s; CI)"
    )
    parser.add_argument("--with-kafka", action="store_true", help="add a Kafka consumer on a real broker (KRaft)")
    parser.add_argument(
        "--with-jaeger",
        action="store_true",
        help="trace every request into a local Jaeger (built from its Go module the first time: ~6 min); "
        "the summary draws the slowest trace, traces.json keeps them all",
    )
    parser.add_argument("--out", type=Path, help="directory for config, logs and report (default: a new temp dir)")
    parser.add_argument("--sync-period", type=_positive, default=1.0, help="HPA sync period in seconds (cluster: 15)")
    parser.add_argument(
        "--scale-down-window",
        type=whole_number("a whole number of seconds >= 0"),
        default=5,
        help="scale-down stabilization in seconds (cluster: 300)",
    )


def _positive(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"{text} is not a positive number of seconds")
    return value


def run(args: argparse.Namespace) -> int:
    run_dir = args.out or Path(tempfile.mkdtemp(prefix="zeroscale-demo-"))
    run_dir.mkdir(parents=True, exist_ok=True)
    timing = Timing(sync_period=args.sync_period, scale_down_window=args.scale_down_window)
    demo = Demo(PLANS[args.scenario], timing, run_dir.resolve(), args.with_kafka, args.with_jaeger)
    return asyncio.run(demo.main())


def _notes(timing: Timing, with_kafka: bool) -> list[str]:
    notes = [
        f"HPA: adapter/hpa (Kubernetes v1.37 rules) reads the adapter's external metrics API over HTTPS every "
        f"{timing.sync_period:g}s; scale-up Pods 4 per {timing.policy_period}s, no up-window; "
        f"scale-down Percent 100 per {timing.policy_period}s after a {timing.scale_down_window}s stabilization "
        "window (a cluster's defaults: 15s sync, 300s window).",
        "web: AverageValue 10 on demo-http-pending{route=web} (requests held or in flight in the proxy, "
        "pushed to the adapter over gRPC); the proxy wakes it from zero itself (Local scale target, development mode).",
        "worker: AverageValue 5 on demo-jobs (the length of the Redis list demo:jobs); only its HPA wakes it.",
    ]
    if with_kafka:
        notes.append(f"consumer: AverageValue 10 on demo-kafka-lag{{group={KAFKA_GROUP}}} (topic {KAFKA_TOPIC}).")
    return notes


class Demo:
    def __init__(self, plan: Plan, timing: Timing, run_dir: Path, with_kafka: bool, with_jaeger: bool) -> None:
        self.plan = plan
        self.timing = timing
        self.run_dir = run_dir
        self.with_kafka = with_kafka
        self.with_jaeger = with_jaeger
        self.timeline = Timeline()
        self.supervisor = Supervisor(run_dir / "logs")
        self.ports = Ports()
        self.workloads = self._workloads()
        self.hpas: dict[str, LocalHPA] = {}
        self.view = View(self.timeline, self.hpas)

    def _workloads(self) -> dict[str, LocalWorkload]:
        """Each command is built when a replica starts: `ports` is filled in as the servers start."""
        python, ports = sys.executable, self.ports
        apps = [python, "-m", "adapter.demo.apps"]
        workloads = {
            "web": LocalWorkload(
                "web", lambda i: [*apps, "http", "--port", str(ports.web), "--replica", f"web-{i}"], self.supervisor
            ),
            "worker": LocalWorkload(
                "worker",
                lambda i: [
                    *apps,
                    "worker",
                    "--redis-url",
                    ports.redis_url,
                    "--key",
                    JOBS_KEY,
                    "--done-key",
                    JOBS_DONE_KEY,
                ],
                self.supervisor,
            ),
        }
        if self.with_kafka:
            # Built when a replica starts, as the others are: the broker's port is known only once it runs.
            kafka = [*apps, "kafka", "--topic", KAFKA_TOPIC, "--group", KAFKA_GROUP]
            workloads["consumer"] = LocalWorkload(
                "consumer", lambda i: [*kafka, "--bootstrap", ports.kafka_bootstrap], self.supervisor
            )
        return workloads

    async def main(self) -> int:
        loop = asyncio.get_running_loop()
        main_task = asyncio.current_task()
        assert main_task is not None
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(signum, main_task.cancel)
        self.view.line(f"zeroscale demo ({self.plan.name}): files in {self.run_dir}")
        timing = self.timing
        self.view.line(
            f"HPA clock: sync every {timing.sync_period:g}s, scale-down stabilization {timing.scale_down_window}s, "
            f"policies per {timing.policy_period}s (a cluster's defaults: 15s, 300s, 15s)"
        )
        try:
            return await self._run()
        except (StackError, ChildFailed) as err:
            self.view.line(f"demo: {err}")
            return 2
        except asyncio.CancelledError:
            self.view.line("demo: interrupted; stopping everything it started")
            return 130
        finally:
            self.view.stop()
            for signum in (signal.SIGINT, signal.SIGTERM):
                loop.remove_signal_handler(signum)
            await asyncio.gather(*(w.close() for w in self.workloads.values()))
            await self.supervisor.stop_all()

    def _proxy_woke(self, name: str, before: int, after: int) -> None:
        why = "a request was held while no replica was ready"
        self.timeline.events.append(ScaleEvent(self.timeline.now(), name, "proxy", before, after, why))

    def _synced(self, reading: Reading) -> None:
        self.timeline.metric_values.setdefault(reading.hpa, []).append((reading.at, reading.value))
        decision = reading.decision
        if decision.rescale:
            self.timeline.events.append(
                ScaleEvent(
                    reading.at, reading.hpa, "hpa", decision.current_replicas, decision.desired_replicas, decision.why
                )
            )

    async def _run(self) -> int:
        scaler = await start_scaler(self.workloads, self._proxy_woke, HOST)
        # Held until the end: the web app's replicas all listen on it (SO_REUSEPORT), nobody else can take it.
        web_port = shared_port(HOST)
        self.ports.web = web_port.getsockname()[1]
        client: KubeClient | None = None
        background: list[asyncio.Task[None]] = []
        try:
            scaler_port: int = scaler.sockets[0].getsockname()[1]
            manifests_text = hpa_manifests(self.timing, self.with_kafka)
            (self.run_dir / "hpa.yaml").write_text(manifests_text)
            self.view.line(
                "starting redis-server"
                + (", a Kafka broker" if self.with_kafka else "")
                + (", Jaeger (built the first time: about 6 min)" if self.with_jaeger else "")
                + ", adapter, proxy"
            )
            await start_redis(self.supervisor, self.run_dir, self.ports)
            if self.with_kafka:
                await start_kafka(self.supervisor, self.run_dir, self.ports)
            if self.with_jaeger:
                await self._start_jaeger()
            await start_zeroscale(self.supervisor, self.run_dir, self.ports, scaler_port, self.with_kafka)
            # As the aggregator would: HTTPS, the serving certificate checked against this run's CA.
            client = adapter_client(f"https://localhost:{self.ports.adapter}", ca_file=self.run_dir / "tls" / "ca.crt")
            for manifest in load_hpas(manifests_text):
                self.hpas[manifest.spec.name] = LocalHPA(manifest, self.workloads[manifest.spec.name], client)
            await self._first_reads()
            self.view.line(
                f"ask the HPA math yourself meanwhile: zeroscale explain -f {self.run_dir / 'hpa.yaml'} "
                f"--adapter-url https://localhost:{self.ports.adapter} --ca-file {self.run_dir / 'tls' / 'ca.crt'} "
                "--replicas 0 --scaled-to-zero"
            )
            background = [
                asyncio.create_task(run_hpas(self.hpas, self.timing.sync_period, self.timeline.now, self._synced)),
                asyncio.create_task(sample_forever(self.timeline, self.workloads, self.ports.proxy_admin)),
                asyncio.create_task(self._tick_view()),
            ]
            self.view.start()
            # Half a sync period in: the first request meets no HPA sync, so the proxy's wake is what answers it.
            await asyncio.sleep(self.timing.sync_period / 2)
            scenario = Scenario(
                self.plan,
                self.timeline,
                self.workloads,
                self.ports.proxy,
                self.ports.redis_url,
                self.ports.kafka_bootstrap if self.with_kafka else None,
            )
            outcome = await scenario.run()
            await asyncio.sleep(0.5)  # one more sample at the end state
            self.view.stop()
            summary = summarize(self.plan.name, self.timeline, outcome)
            report = write_report(self.run_dir, summary, self.timeline, _notes(self.timing, self.with_kafka))
            self._print_summary(summary, report)
            if self.ports.jaeger is not None:
                traces = self.run_dir / "traces.json"
                for line in await asyncio.to_thread(jaeger.save_traces, jaeger.query_url(self.ports.jaeger), traces):
                    self.view.line(line)
            return 0 if summary.passed else 1
        finally:
            for task in background:
                task.cancel()
            await asyncio.gather(*background, return_exceptions=True)
            if client is not None:
                await client.close()
            scaler.close()
            web_port.close()

    async def _start_jaeger(self) -> None:
        await start_jaeger(self.supervisor, self.run_dir, self.ports)
        assert self.ports.jaeger is not None
        self.view.line(
            f"Jaeger: the adapter and the proxy send every trace to {jaeger.otlp_traces_endpoint(self.ports.jaeger)}; "
            f"its query API is {jaeger.query_url(self.ports.jaeger)}/api/v3/traces while the demo runs (a build "
            "from Jaeger's Go module has no UI pages)"
        )

    async def _first_reads(self) -> None:
        """Wait until every HPA can read its metric (the sources connect in the background)."""
        deadline = time.monotonic() + _FIRST_READ_WAIT
        while True:
            readings = [await hpa.sync(self.timeline.now()) for hpa in self.hpas.values()]
            failing = [r for r in readings if r.value is None]
            if not failing:
                return
            if time.monotonic() > deadline:
                whys = "; ".join(f"{r.hpa}: {r.decision.why}" for r in failing)
                raise StackError(f"the HPAs cannot read their metrics: {whys}; see {self.supervisor.log_dir}")
            await asyncio.sleep(0.25)

    async def _tick_view(self) -> None:
        while True:
            self.view.tick()
            await asyncio.sleep(_VIEW_TICK)

    def _print_summary(self, summary: Summary, report: Path) -> None:
        self.view.line("")
        for line in summary_lines(summary):
            self.view.line(line)
        verdict = "PASSED" if summary.passed else "FAILED"
        wanted = "every workload 0 -> >=1 -> 0, no request lost, every job and message processed"
        self.view.line(f"{verdict} (wanted: {wanted})")
        self.view.line(f"report: {report}")
