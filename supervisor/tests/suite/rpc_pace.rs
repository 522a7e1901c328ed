//! The connection thread's poll for a script's next call (docs/rpc-channel.md): it must stay
//! within its window, so a script that stops calling costs the supervisor no CPU.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use super::common::Session;
use super::pool::serial;
use std::time::{Duration, Instant};
use vibeos_supervisor::{execute, Interrupt};

/// CPU ticks used so far by this process's connection threads, and how many there are.
fn connection_threads_cpu() -> (u64, usize) {
    let mut ticks = 0;
    let mut threads = 0;
    for task in std::fs::read_dir("/proc/self/task").unwrap().flatten() {
        let comm = std::fs::read_to_string(task.path().join("comm")).unwrap_or_default();
        if comm.trim() != "vibeos-rpc-conn" {
            continue;
        }
        let stat = std::fs::read_to_string(task.path().join("stat")).unwrap_or_default();
        // Fields after the command name: state is the first, utime the 12th, stime the 13th.
        let Some((_, after)) = stat.rsplit_once(')') else {
            continue;
        };
        let fields: Vec<&str> = after.split_whitespace().collect();
        if fields.len() > 12 {
            threads += 1;
            ticks += fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap();
        }
    }
    (ticks, threads)
}

#[test]
fn a_script_pausing_after_a_burst_of_calls_costs_its_connection_thread_no_cpu() {
    let python = require_python!();
    let _serial = serial();
    let session = Session::new(python);
    std::fs::write(session.cwd().join("note.txt"), "alpha\nbeta\n").unwrap();
    // The burst makes the calls back to back, which is when the thread polls; then the script
    // sleeps with its connection open.
    let code = "import time\nfrom vibeos_tools import read_file\n\
                for _ in range(300):\n    read_file('note.txt')\n\
                open('paused', 'w').close()\ntime.sleep(1.5)\n\
                print(read_file('note.txt')['total_lines'])\n";
    let mut request = session.request(code);
    request.max_tool_calls = 1000;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let running = runtime.spawn(execute(request, vibeos_tools::registry(), Interrupt::new()));
    let paused = session.cwd().join("paused");
    let start = Instant::now();
    while !paused.exists() {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "the burst never ended"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    std::thread::sleep(Duration::from_millis(100));
    let (before, threads) = connection_threads_cpu();
    std::thread::sleep(Duration::from_secs(1));
    let (after, _) = connection_threads_cpu();
    let result = runtime.block_on(running).unwrap();
    let json = result.to_json();
    assert_eq!(json["status"], "success", "{json}");
    assert_eq!(result.output, "2\n");
    assert_eq!(
        threads, 1,
        "the script's one connection thread was not found"
    );
    // A thread polling through the pause would use the whole second (100 ticks); a blocked
    // one uses none. The slack is for /proc's rounding.
    assert!(
        after - before <= 3,
        "the connection thread used {} ticks of CPU while the script slept",
        after - before
    );
}
