//! Cost of the hot path: recording an outcome and asking for permits, on a controller alone,
//! on a controller shared behind the library's mutex, and through the gate (acquire, start,
//! finish), single-threaded and with two threads; against acquiring and releasing a
//! `tokio::sync::Semaphore` permit in the same run.

use std::hint::black_box;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use backpressure_worker::controller::{self, Controller, Nanos, Outcome, Settings};
use backpressure_worker::metrics::Metrics;
use backpressure_worker::permits::Gate;
use criterion::{Criterion, criterion_group, criterion_main};
use tokio::sync::Semaphore;

fn outcome(i: u64) -> Outcome {
    if i.is_multiple_of(20) {
        Outcome::DependencyFailure
    } else {
        Outcome::Success
    }
}

/// Runs `op` `iters` times on this thread while another thread runs `other` in a loop; returns
/// this thread's elapsed time.
fn contended(iters: u64, op: impl Fn(u64), other: impl Fn(u64) + Send + 'static) -> Duration {
    let stop = Arc::new(AtomicBool::new(false));
    let started = Arc::new(AtomicBool::new(false));
    let (s2, st2) = (stop.clone(), started.clone());
    let handle = thread::spawn(move || {
        let mut i = 0u64;
        st2.store(true, Ordering::Release);
        while !s2.load(Ordering::Relaxed) {
            other(i);
            i += 1;
        }
    });
    while !started.load(Ordering::Acquire) {
        std::hint::spin_loop();
    }
    let t = Instant::now();
    for i in 0..iters {
        op(i);
    }
    let elapsed = t.elapsed();
    stop.store(true, Ordering::Relaxed);
    let _ = handle.join();
    elapsed
}

fn bench(c: &mut Criterion) {
    let mut g = c.benchmark_group("hot_path");

    // The controller alone (what the simulator drives): one record + one permits call.
    let mut ctl = controller::build(Settings::default(), 1);
    let mut i = 0u64;
    g.bench_function("controller/record+permits", |b| {
        b.iter(|| {
            i += 1;
            let now = Nanos(i * 1000);
            ctl.record(now, outcome(i));
            black_box(ctl.permits(now, black_box(3)))
        })
    });

    // Shared behind a mutex, as the gate holds it.
    let shared: Arc<Mutex<Box<dyn Controller>>> =
        Arc::new(Mutex::new(controller::build(Settings::default(), 1)));
    let record_and_permits = |m: &Mutex<Box<dyn Controller>>, i: u64| {
        let now = Nanos(i * 1000);
        if let Ok(mut c) = m.lock() {
            c.record(now, outcome(i));
        }
        if let Ok(mut c) = m.lock() {
            black_box(c.permits(now, 3));
        }
    };
    let s1 = shared.clone();
    let mut i = 0u64;
    g.bench_function("shared/record+permits/1-thread", |b| {
        b.iter(|| {
            i += 1;
            record_and_permits(&s1, i)
        })
    });
    g.bench_function("shared/record+permits/2-threads", |b| {
        b.iter_custom(|iters| {
            let (a, o) = (shared.clone(), shared.clone());
            contended(
                iters,
                move |i| record_and_permits(&a, i),
                move |i| record_and_permits(&o, i),
            )
        })
    });

    // The gate: try_acquire(1) + start + finish(outcome), with metrics.
    let gate = Gate::builder(controller::build(Settings::default(), 1))
        .metrics(Metrics::new("bench"))
        .build();
    let cycle = |g: &Gate, i: u64| {
        if let Some(mut p) = g.try_acquire(1) {
            let m = p.start();
            drop(p);
            m.finish(outcome(i));
        }
    };
    let g1 = gate.clone();
    let mut i = 0u64;
    g.bench_function("gate/acquire+start+finish/1-thread", |b| {
        b.iter(|| {
            i += 1;
            cycle(&g1, i)
        })
    });
    g.bench_function("gate/acquire+start+finish/2-threads", |b| {
        b.iter_custom(|iters| {
            let (a, o) = (gate.clone(), gate.clone());
            contended(iters, move |i| cycle(&a, i), move |i| cycle(&o, i))
        })
    });

    // Baseline: a tokio semaphore permit acquired and released.
    let sem = Arc::new(Semaphore::new(16));
    let s = sem.clone();
    g.bench_function("tokio_semaphore/acquire+release/1-thread", |b| {
        b.iter(|| drop(black_box(s.try_acquire())))
    });
    g.bench_function("tokio_semaphore/acquire+release/2-threads", |b| {
        b.iter_custom(|iters| {
            let (a, o) = (sem.clone(), sem.clone());
            contended(
                iters,
                move |_| drop(black_box(a.try_acquire())),
                move |_| drop(black_box(o.try_acquire())),
            )
        })
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
