use super::*;

fn stream(n: usize) -> CUstream {
    n as CUstream
}

#[test]
fn the_estimate_follows_its_samples() {
    let mut e = Events::new();
    e.learn(Kind::Kernel, 20_000);
    assert_eq!(
        e.estimate(Kind::Kernel),
        20_000,
        "the first sample is taken as it is"
    );
    // A launch that waited out another context's time slice counts like any sample...
    e.learn(Kind::Kernel, 2_000_000);
    assert_eq!(e.estimate(Kind::Kernel), 515_000);
    // ...and the ones after it bring the estimate back.
    for _ in 0..30 {
        e.learn(Kind::Kernel, 20_000);
    }
    assert!(e.estimate(Kind::Kernel) < 21_000);
    let g = 7usize as CUgraphExec;
    e.learn(Kind::Graph(g), 3_000_000);
    assert_eq!(e.estimate(Kind::Graph(g)), 3_000_000, "per executable");
    assert!(e.estimate(Kind::Kernel) < 21_000);
}

/// The least measurement keeps a launch's own time while most samples include a sibling's
/// kernels (two busy processes of a slice: every other sample twice as long), and follows
/// a launch that really got longer.
#[test]
fn the_least_measurement_ignores_interleaved_samples() {
    let mut e = Events::new();
    for i in 0..40 {
        e.learn(Kind::Kernel, if i % 2 == 0 { 1_000_000 } else { 2_000_000 });
    }
    assert!(e.estimate(Kind::Kernel) > 1_400_000);
    assert!(
        e.least(Kind::Kernel) <= 1_062_500,
        "{}",
        e.least(Kind::Kernel)
    );
    for _ in 0..40 {
        e.learn(Kind::Kernel, 4_000_000);
    }
    assert!(
        e.least(Kind::Kernel) > 3_700_000,
        "{}",
        e.least(Kind::Kernel)
    );
    let g = 7usize as CUgraphExec;
    e.learn(Kind::Graph(g), 3_000_000);
    e.learn(Kind::Graph(g), 6_000_000);
    assert_eq!(e.least(Kind::Graph(g)), 3_187_500, "per executable");
}

#[test]
fn launches_run_between_fences_about_500_us_of_work_apart() {
    let mut e = Events::new();
    e.learn(Kind::Kernel, 20_000); // 500 µs / 20 µs: a fence every 25 launches (±25%)
    let (mut runs, mut fences, mut now) = (0, 0, 1_000);
    for _ in 0..1200 {
        match e.plan(stream(1), Kind::Kernel, now) {
            Track::Run => {
                e.add_to_run(stream(1), Kind::Kernel, now);
                runs += 1;
            }
            // What `push` does to the run, without a driver.
            Track::Measure => {
                e.run_n = 0;
                e.run_ns = 0;
                e.fence_every = e.next_interval();
                fences += 1;
            }
        }
        now += 20_000;
    }
    assert_eq!(runs + fences, 1200);
    assert!(
        (40..=60).contains(&fences),
        "{fences} fences in 1200 launches"
    );
}

#[test]
fn the_fence_interval_is_jittered_within_a_quarter() {
    let mut e = Events::new();
    e.learn(Kind::Kernel, 10_000); // 50 launches
    let seen: Vec<u32> = (0..200).map(|_| e.next_interval()).collect();
    assert!(seen.iter().all(|n| (37..=63).contains(n)), "{seen:?}");
    assert!(seen.iter().any(|n| *n != seen[0]), "no jitter: {seen:?}");
    e.learn(Kind::Kernel, 0);
    e.learn(Kind::Kernel, 0);
    assert!((0..50).all(|_| e.next_interval() <= FENCE_MAX + FENCE_MAX / 4));
    let mut long = Events::new();
    long.learn(Kind::Kernel, 1_000_000);
    assert!(
        (0..50).all(|_| long.next_interval() == 1),
        "long kernels: every launch"
    );
}

#[test]
fn what_is_fenced() {
    let mut e = Events::new();
    e.learn(Kind::Kernel, 1_000);
    e.fence_every = 10;
    assert_eq!(e.plan(stream(1), Kind::Kernel, 0), Track::Run);
    e.add_to_run(stream(1), Kind::Kernel, 0);
    // Due: the tenth launch of the interval.
    e.run_n = 9;
    assert_eq!(e.plan(stream(1), Kind::Kernel, 0), Track::Measure);
    e.run_n = 1;
    // Another stream: fenced (the run on stream 1 is left to its estimate).
    assert_eq!(e.plan(stream(2), Kind::Kernel, 0), Track::Measure);
    // A graph replay: always.
    let g = 7usize as CUgraphExec;
    assert_eq!(e.plan(stream(1), Kind::Graph(g), 0), Track::Measure);
    // While the scheduler counts launches: each one.
    e.track_each(5_000);
    assert_eq!(e.plan(stream(1), Kind::Kernel, 4_999), Track::Measure);
    assert_eq!(e.plan(stream(1), Kind::Kernel, 5_000), Track::Run);
}

#[test]
fn the_run_counts_until_its_estimated_end() {
    let mut e = Events::new();
    e.learn(Kind::Kernel, 100_000);
    let t = sched::now_ns();
    e.add_to_run(stream(1), Kind::Kernel, t);
    e.add_to_run(stream(1), Kind::Kernel, t);
    e.remove_from_run(Kind::Kernel); // refused by the driver
    assert_eq!((e.run_n, e.run_ns), (1, 100_000));
    assert_eq!(
        e.unfenced_end(),
        t + 200_000,
        "the refused launch's time stays booked"
    );
    let left = e.outstanding_ns();
    assert!(left > 0 && left <= 200_000, "{left}");
    assert_eq!(e.pending(), 1);
    // No fence ring, no driver: past its estimate the run counts as done.
    e.run_end = 1;
    e.tail_end = 1;
    assert_eq!(e.outstanding_ns(), 0);
    assert_eq!(e.pending(), 0);
}
