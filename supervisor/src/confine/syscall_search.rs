//! Seccomp programs that find the syscall by binary search instead of one long chain.
//!
//! seccompiler compiles a filter to a single chain: the syscall number is compared with every
//! listed syscall in turn. Strict mode's `main` allowlist (about two hundred syscalls) becomes
//! about a thousand instructions, and installing it cost more than the script process's fork:
//! the kernel JIT-compiles every instruction, then runs the filter once for each syscall number
//! to learn which numbers it may allow without running it again (the seccomp action cache). A
//! number listed late, or not at all, walks the whole chain each time.
//!
//! This module keeps seccompiler as the compiler of every rule and rebuilds only the dispatch:
//! - syscalls whose rules have no argument conditions become points on the number line, found by
//!   a tree of `jge` comparisons whose leaves return the filter's action;
//! - each syscall with argument conditions is compiled by seccompiler on its own, as a filter of
//!   that one syscall, and appended whole; its leaf jumps to it.
//!
//! What seccompiler decides for a syscall number depends only on that number's rules, so the
//! searched program decides the same for every number and every argument. The tests run both
//! programs in a BPF evaluator over every syscall number and many argument vectors, and strict
//! mode's attack tests run the searched program in the kernel.

use seccompiler::{sock_filter, BpfProgram, TargetArch};
use serde_json::{Map, Value};
use std::collections::BTreeMap;

/// `BPF_LD | BPF_W | BPF_ABS`: load a 32-bit word of `struct seccomp_data`.
const LD_WORD: u16 = 0x20;
/// `BPF_JMP | BPF_JA`: jump forward by `k`.
const JUMP: u16 = 0x05;
/// `BPF_JMP | BPF_JEQ | BPF_K`.
const JUMP_IF_EQUAL: u16 = 0x15;
/// `BPF_JMP | BPF_JGE | BPF_K` (unsigned).
const JUMP_IF_AT_LEAST: u16 = 0x35;
/// `BPF_RET | BPF_K`.
const RETURN: u16 = 0x06;
/// Offset of the syscall number in `struct seccomp_data`.
const NR_OFFSET: u32 = 0;
/// seccompiler starts every program with three instructions that check the architecture.
const ARCH_CHECK_LEN: usize = 3;
/// The kernel refuses longer classic BPF programs (`BPF_MAXINSNS`).
const MAX_INSTRUCTIONS: usize = 4096;

/// A filter could not be rebuilt; the caller keeps seccompiler's own program, which is correct
/// but slower to install.
#[derive(Debug, thiserror::Error)]
pub enum SearchError {
    /// seccompiler refused a part of the filter that it accepted whole.
    #[error("seccompiler rejected part of the filter: {0}")]
    Compile(String),
    /// The filter is not an object with a `filter` list of rules naming their syscall.
    #[error("the filter is not an object with a `filter` list of rules that name a syscall")]
    Shape,
    /// seccompiler's output is not laid out as this module expects (a new seccompiler version).
    #[error("seccompiler's program is not laid out as expected at instruction {0}")]
    Layout(usize),
    /// Two syscall names with argument conditions have the same number.
    #[error("two syscall names with argument conditions have the number {0}")]
    SharedNumber(u32),
    /// The rebuilt program is longer than the kernel accepts.
    #[error("the rebuilt program would have {0} instructions, more than BPF allows")]
    TooLong(usize),
    /// Two filters cannot be one program; both are installed.
    #[error("the filters cannot be merged into one program: {0}")]
    NotMergeable(&'static str),
}

/// What the tree does for a range of syscall numbers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Leaf {
    /// Return this seccomp action.
    Return(u32),
    /// Jump to the appended program of the conditional syscall with this index.
    Conditions(usize),
}

/// Compiles one filter of a seccompiler JSON policy (the object holding `mismatch_action`,
/// `match_action` and `filter`) to a program that decides what seccompiler's program for it
/// decides, by binary search on the syscall number.
pub fn searched_program(filter: &Value, arch: TargetArch) -> Result<BpfProgram, SearchError> {
    emit(searched_parts(filter, arch)?)
}

/// `SECCOMP_RET_ALLOW`.
const RET_ALLOW: u32 = 0x7fff_0000;

/// The kernel's choice among the results of several installed filters, given most recently
/// installed first (`seccomp_run_filters`): the most severe action wins, compared as a signed
/// number after masking off the data, and among equally severe ones the first seen.
fn kernel_pick(most_recent_first: &[u32]) -> u32 {
    let severity = |ret: u32| (ret & 0xffff_0000) as i32;
    let mut ret = RET_ALLOW;
    for &r in most_recent_first {
        if severity(r) < severity(ret) {
            ret = r;
        }
    }
    ret
}

/// Compiles two filters, installed `first` then `last`, to one program that decides every call
/// as the kernel decides it with both installed ([`kernel_pick`]), so a script process installs,
/// converts and JIT-compiles one program instead of two (each install cost 70 µs or more).
///
/// Done only where that is a choice per syscall number: `first` must have no argument
/// conditions, and wherever `last` has some, `first` must allow. Otherwise the caller installs
/// both programs as they are.
pub fn merged_program(
    first: &Value,
    last: &Value,
    arch: TargetArch,
) -> Result<BpfProgram, SearchError> {
    let first = searched_parts(first, arch)?;
    let mut last = searched_parts(last, arch)?;
    if !first.bodies.is_empty() {
        return Err(SearchError::NotMergeable(
            "the first filter has argument conditions",
        ));
    }
    if first.arch_check != last.arch_check {
        return Err(SearchError::NotMergeable(
            "the filters check the architecture differently",
        ));
    }
    let first_action = |nr: u32| match first.points.get(&nr) {
        Some(Leaf::Return(action)) => *action,
        _ => first.mismatch,
    };
    let mut points = BTreeMap::new();
    for &nr in first.points.keys().chain(last.points.keys()) {
        let leaf = match last.points.get(&nr) {
            Some(Leaf::Conditions(index)) => {
                if kernel_pick(&[RET_ALLOW, first_action(nr)]) != RET_ALLOW {
                    return Err(SearchError::NotMergeable(
                        "the first filter decides a call the last one checks the arguments of",
                    ));
                }
                Leaf::Conditions(*index)
            }
            Some(Leaf::Return(action)) => Leaf::Return(kernel_pick(&[*action, first_action(nr)])),
            None => Leaf::Return(kernel_pick(&[last.mismatch, first_action(nr)])),
        };
        points.insert(nr, leaf);
    }
    last.points = points;
    last.mismatch = kernel_pick(&[last.mismatch, first.mismatch]);
    emit(last)
}

/// A filter taken apart: its architecture check, what each listed syscall number leads to, the
/// action for every other number, and the conditional syscalls' programs.
struct Parts {
    arch_check: Vec<sock_filter>,
    points: BTreeMap<u32, Leaf>,
    mismatch: u32,
    bodies: Vec<Vec<sock_filter>>,
}

fn searched_parts(filter: &Value, arch: TargetArch) -> Result<Parts, SearchError> {
    let object = filter.as_object().ok_or(SearchError::Shape)?;
    let rules = object
        .get("filter")
        .and_then(Value::as_array)
        .ok_or(SearchError::Shape)?;
    let mut by_name: BTreeMap<&str, Vec<&Value>> = BTreeMap::new();
    for rule in rules {
        let name = rule
            .get("syscall")
            .and_then(Value::as_str)
            .ok_or(SearchError::Shape)?;
        by_name.entry(name).or_default().push(rule);
    }
    let has_conditions = |rule: &&Value| rule.get("args").is_some_and(|a| !a.is_null());
    let mut plain = Vec::new();
    let mut conditional = Vec::new();
    for (_, entries) in by_name {
        if entries.iter().any(has_conditions) {
            conditional.push(entries);
        } else {
            plain.extend(entries);
        }
    }
    // One compile for all parts: seccompiler builds its syscall table on every call.
    let part = |rules: Vec<&Value>| {
        let mut part: Map<String, Value> = object
            .iter()
            .filter(|(key, _)| *key != "filter")
            .map(|(key, value)| (key.clone(), value.clone()))
            .collect();
        part.insert(
            "filter".into(),
            Value::Array(rules.into_iter().cloned().collect()),
        );
        Value::Object(part)
    };
    let mut set = Map::new();
    set.insert("plain".into(), part(plain));
    let conditional_count = conditional.len();
    for (index, entries) in conditional.into_iter().enumerate() {
        set.insert(format!("conditions {index}"), part(entries));
    }
    let text = Value::Object(set).to_string();
    let mut compiled = seccompiler::compile_from_json(text.as_bytes(), arch)
        .map_err(|e| SearchError::Compile(e.to_string()))?;
    let mut take = |name: &str| compiled.remove(name).ok_or(SearchError::Shape);

    let plain_program = take("plain")?;
    let arch_check = plain_program
        .get(..ARCH_CHECK_LEN)
        .ok_or(SearchError::Layout(0))?
        .to_vec();
    let (plain_numbers, mismatch) = plain_points(&plain_program)?;
    let mut points: BTreeMap<u32, Leaf> = plain_numbers
        .into_iter()
        .map(|(nr, action)| (nr, Leaf::Return(action)))
        .collect();
    let mut bodies = Vec::with_capacity(conditional_count);
    for index in 0..conditional_count {
        let program = take(&format!("conditions {index}"))?;
        if program.get(..ARCH_CHECK_LEN) != Some(arch_check.as_slice()) {
            return Err(SearchError::Layout(0));
        }
        let body = program
            .get(ARCH_CHECK_LEN..)
            .ok_or(SearchError::Layout(ARCH_CHECK_LEN))?;
        let nr = match body {
            [load, first, ..] if is_load_nr(load) && first.code == JUMP_IF_EQUAL => first.k,
            _ => return Err(SearchError::Layout(ARCH_CHECK_LEN)),
        };
        // Two names for one number (an alias) would have their rules merged by seccompiler;
        // one body per number cannot say that, so such a filter keeps seccompiler's chain.
        if let Some(Leaf::Conditions(_)) = points.insert(nr, Leaf::Conditions(index)) {
            return Err(SearchError::SharedNumber(nr));
        }
        // The body reloads the number and compares it again; it is reached only for `nr`, so
        // that is a wasted instruction, not a different decision.
        bodies.push(body.to_vec());
    }
    Ok(Parts {
        arch_check,
        points,
        mismatch,
        bodies,
    })
}

/// The program of `parts`: the architecture check, the search tree, then the conditional
/// syscalls' programs.
fn emit(parts: Parts) -> Result<BpfProgram, SearchError> {
    let Parts {
        arch_check,
        points,
        mismatch,
        bodies,
    } = parts;
    let ranges = ranges_of(&points, mismatch);
    let tree_len = tree_len(ranges.len());
    let mut program = arch_check;
    program.push(load_nr());
    let mut body_starts = Vec::with_capacity(bodies.len());
    let mut next = program.len() + tree_len;
    for body in &bodies {
        body_starts.push(next);
        next += body.len();
    }
    if next > MAX_INSTRUCTIONS {
        return Err(SearchError::TooLong(next));
    }
    emit_tree(&ranges, &body_starts, &mut program);
    for body in bodies {
        program.extend(body);
    }
    Ok(program)
}

/// The numbers of a program whose rules have no conditions, with their action, and the
/// mismatch action. seccompiler lays such a program out as the architecture check, a load of
/// the number, five instructions per syscall (`jeq nr; ja 1; ja 2; ret match; ret mismatch`)
/// and a final `ret mismatch`, which the loop leaves as the one instruction too few for a
/// chain.
fn plain_points(program: &[sock_filter]) -> Result<(Vec<(u32, u32)>, u32), SearchError> {
    let mut at = ARCH_CHECK_LEN;
    if program.len() == ARCH_CHECK_LEN + 1 {
        // No rules at all: seccompiler returns the mismatch action after the check.
        return match &program[at] {
            i if i.code == RETURN => Ok((Vec::new(), i.k)),
            _ => Err(SearchError::Layout(at)),
        };
    }
    if !program.get(at).is_some_and(is_load_nr) {
        return Err(SearchError::Layout(at));
    }
    at += 1;
    let mut numbers = Vec::new();
    while let Some(chain) = program.get(at..at + 5) {
        let shaped = chain[0].code == JUMP_IF_EQUAL
            && (chain[0].jt, chain[0].jf) == (0, 1)
            && (chain[1].code, chain[1].k) == (JUMP, 1)
            && (chain[2].code, chain[2].k) == (JUMP, 2)
            && chain[3].code == RETURN
            && chain[4].code == RETURN;
        if !shaped {
            return Err(SearchError::Layout(at));
        }
        numbers.push((chain[0].k, chain[3].k));
        at += 5;
    }
    match program.get(at) {
        Some(last) if last.code == RETURN && at == program.len() - 1 => Ok((numbers, last.k)),
        _ => Err(SearchError::Layout(at)),
    }
}

/// The number line as consecutive ranges, each given by its first number, merging neighbours
/// that do the same.
fn ranges_of(points: &BTreeMap<u32, Leaf>, mismatch: u32) -> Vec<(u32, Leaf)> {
    let mut ranges: Vec<(u32, Leaf)> = Vec::with_capacity(points.len() * 2 + 1);
    let mut push = |first: u32, leaf: Leaf| {
        if ranges.last().map(|(_, l)| *l) != Some(leaf) {
            ranges.push((first, leaf));
        }
    };
    let mut next = Some(0u32);
    for (&nr, &leaf) in points {
        if let Some(from) = next.filter(|from| *from < nr) {
            push(from, Leaf::Return(mismatch));
        }
        push(nr, leaf);
        next = nr.checked_add(1);
    }
    if let Some(from) = next {
        push(from, Leaf::Return(mismatch));
    }
    ranges
}

/// Instructions of the tree over `ranges` ranges: one per leaf, one or two per comparison.
fn tree_len(ranges: usize) -> usize {
    if ranges <= 1 {
        return 1;
    }
    let left = ranges / 2;
    let left_len = tree_len(left);
    comparison_len(left_len) + left_len + tree_len(ranges - left)
}

/// A comparison whose left half is short jumps over it in its own offset; a longer one needs a
/// separate long jump, since a conditional offset is one byte.
fn comparison_len(left_len: usize) -> usize {
    if left_len <= u8::MAX as usize {
        1
    } else {
        2
    }
}

/// Emits the tree in preorder: each comparison `jge first-of-right-half` goes on into the left
/// half when false and over it into the right half when true.
fn emit_tree(ranges: &[(u32, Leaf)], body_starts: &[usize], out: &mut BpfProgram) {
    if let [(_, leaf)] = ranges {
        match *leaf {
            Leaf::Return(action) => out.push(statement(RETURN, action)),
            Leaf::Conditions(index) => {
                let offset = body_starts[index] - (out.len() + 1);
                out.push(statement(JUMP, offset as u32));
            }
        }
        return;
    }
    let left = ranges.len() / 2;
    let left_len = tree_len(left);
    let first_of_right = ranges[left].0;
    match u8::try_from(left_len) {
        Ok(over_left) => out.push(sock_filter {
            code: JUMP_IF_AT_LEAST,
            jt: over_left,
            jf: 0,
            k: first_of_right,
        }),
        Err(_) => {
            out.push(sock_filter {
                code: JUMP_IF_AT_LEAST,
                jt: 0,
                jf: 1,
                k: first_of_right,
            });
            out.push(statement(JUMP, left_len as u32));
        }
    }
    emit_tree(&ranges[..left], body_starts, out);
    emit_tree(&ranges[left..], body_starts, out);
}

fn statement(code: u16, k: u32) -> sock_filter {
    sock_filter {
        code,
        jt: 0,
        jf: 0,
        k,
    }
}

fn load_nr() -> sock_filter {
    statement(LD_WORD, NR_OFFSET)
}

fn is_load_nr(instruction: &sock_filter) -> bool {
    (instruction.code, instruction.k) == (LD_WORD, NR_OFFSET)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const AUDIT_ARCH_X86_64: u32 = 0xc000_003e;
    const AUDIT_ARCH_I386: u32 = 0x4000_0003;

    /// `struct seccomp_data` as the kernel lays it out.
    #[derive(Clone, Copy)]
    struct Call {
        nr: u32,
        arch: u32,
        args: [u64; 6],
    }

    impl Call {
        fn word(&self, offset: u32) -> u32 {
            match offset {
                0 => self.nr,
                4 => self.arch,
                // The instruction pointer, never read by these filters.
                8 | 12 => 0,
                o if (16..64).contains(&o) && o % 4 == 0 => {
                    let arg = self.args[(o as usize - 16) / 8];
                    if o % 8 == 0 {
                        arg as u32
                    } else {
                        (arg >> 32) as u32
                    }
                }
                o => panic!("load from offset {o}"),
            }
        }
    }

    /// Runs a classic BPF seccomp program: the action and the instructions executed.
    fn run(program: &[sock_filter], call: &Call) -> (u32, usize) {
        let (mut a, mut pc, mut steps) = (0u32, 0usize, 0usize);
        loop {
            let i = &program[pc];
            steps += 1;
            pc += 1;
            let jump = |taken: bool| if taken { i.jt as usize } else { i.jf as usize };
            match i.code {
                LD_WORD => a = call.word(i.k),
                0x54 => a &= i.k, // BPF_ALU | BPF_AND | BPF_K
                JUMP => pc += i.k as usize,
                JUMP_IF_EQUAL => pc += jump(a == i.k),
                0x25 => pc += jump(a > i.k), // BPF_JGT
                JUMP_IF_AT_LEAST => pc += jump(a >= i.k),
                0x45 => pc += jump(a & i.k != 0), // BPF_JSET
                RETURN => return (i.k, steps),
                code => panic!("instruction {code:#x} at {}", pc - 1),
            }
        }
    }

    /// Values an argument condition could turn on: each constant of the policy, its
    /// neighbours, and the same with high bits set.
    fn argument_values(policy: &Value) -> Vec<u64> {
        let mut values = vec![0, 1, u32::MAX as u64, 1 << 32, u64::MAX, u64::MAX - 1];
        let mut constants = Vec::new();
        collect_constants(policy, &mut constants);
        for v in constants {
            for w in [
                v,
                v.wrapping_add(1),
                v.wrapping_sub(1),
                v | (1 << 32),
                v | (1 << 63),
            ] {
                values.push(w);
            }
        }
        values.sort_unstable();
        values.dedup();
        values
    }

    fn collect_constants(value: &Value, out: &mut Vec<u64>) {
        match value {
            Value::Object(map) => {
                if let Some(v) = map.get("val").and_then(Value::as_u64) {
                    out.push(v);
                }
                if let Some(Value::Object(op)) = map.get("op") {
                    if let Some(mask) = op.get("masked_eq").and_then(Value::as_u64) {
                        out.push(mask);
                    }
                }
                map.values().for_each(|v| collect_constants(v, out));
            }
            Value::Array(items) => items.iter().for_each(|v| collect_constants(v, out)),
            _ => {}
        }
    }

    /// Every syscall number below 1,100, its x32 alias and the edges of the number line, for
    /// two architectures: (number, architecture, the call with zeroed arguments and one with
    /// every argument set to each of `values`).
    fn calls_of_every_number(values: &[u64]) -> impl Iterator<Item = (u32, u32, Vec<Call>)> + '_ {
        let numbers = (0..1100u32)
            .chain((0..600).map(|n| 0x4000_0000 | n))
            .chain([0x7fff_ffff, 0x8000_0000, u32::MAX - 1, u32::MAX]);
        numbers.flat_map(move |nr| {
            [AUDIT_ARCH_X86_64, AUDIT_ARCH_I386].map(|arch| {
                let calls = std::iter::once([0; 6])
                    .chain(values.iter().map(|&v| [v; 6]))
                    .map(|args| Call { nr, arch, args })
                    .collect();
                (nr, arch, calls)
            })
        })
    }

    /// Compares the two programs of every filter of `policy` over every syscall number below
    /// 1,100 and its x32 alias, for two architectures, with every argument slot set to each
    /// interesting value in turn and to pseudo-random mixes of them.
    fn assert_same_decisions(policy: &Value) -> Vec<(String, BpfProgram)> {
        let text = policy.to_string();
        let mut linear = seccompiler::compile_from_json(text.as_bytes(), TargetArch::x86_64)
            .expect("the test policy compiles");
        let values = argument_values(policy);
        let mut state = 0x9e37_79b9_7f4a_7c15u64;
        let mut random = move || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        let mut searched_programs = Vec::new();
        for (name, filter) in policy.as_object().expect("an object") {
            let searched =
                searched_program(filter, TargetArch::x86_64).expect("the filter is rebuilt");
            let linear = linear.remove(name).expect("seccompiler compiled it");
            for (nr, arch, mut calls) in calls_of_every_number(&values) {
                for _ in 0..40 {
                    let mut args = [0; 6];
                    for a in &mut args {
                        *a = values[random() as usize % values.len()];
                    }
                    calls.push(Call { nr, arch, args });
                }
                for call in &calls {
                    assert_eq!(
                        run(&searched, call).0,
                        run(&linear, call).0,
                        "filter {name}, nr {nr:#x}, arch {arch:#x}, args {:x?}",
                        call.args
                    );
                }
            }
            searched_programs.push((name.clone(), searched));
        }
        searched_programs
    }

    #[test]
    fn the_built_in_policy_decides_every_call_as_seccompiler_does_in_far_fewer_steps() {
        let policy: Value = serde_json::from_str(crate::confine::policy::DEFAULT_SECCOMP_X86_64)
            .expect("the built-in policy is JSON");
        let programs = assert_same_decisions(&policy);
        let main = &programs
            .iter()
            .find(|(n, _)| n == "main")
            .expect("main is there")
            .1;
        let linear_len = seccompiler::compile_from_json(
            crate::confine::policy::DEFAULT_SECCOMP_X86_64.as_bytes(),
            TargetArch::x86_64,
        )
        .expect("compiles")["main"]
            .len();
        assert!(
            main.len() * 2 < linear_len,
            "searched {} against linear {linear_len} instructions",
            main.len()
        );
        // The action cache and every unlisted call walk one path of the tree.
        let deepest = (0..1100u32)
            .map(|nr| {
                let call = Call {
                    nr,
                    arch: AUDIT_ARCH_X86_64,
                    args: [0; 6],
                };
                run(main, &call).1
            })
            .max()
            .expect("numbers were run");
        assert!(deepest < 40, "a call took {deepest} instructions");
    }

    #[test]
    fn every_condition_kind_and_action_decides_as_seccompiler_does() {
        let policy = json!({
            "allowlist": {
                "mismatch_action": {"errno": 1},
                "match_action": "allow",
                "filter": [
                    {"syscall": "read"},
                    {"syscall": "write"},
                    {"syscall": "openat"},
                    {"syscall": "exit_group"},
                    {"syscall": "ioctl", "args": [
                        {"index": 1, "type": "dword", "op": "ne", "val": 21522},
                        {"index": 1, "type": "dword", "op": "ne", "val": 21532}]},
                    {"syscall": "fcntl", "args": [
                        {"index": 1, "type": "dword", "op": "eq", "val": 2},
                        {"index": 2, "type": "dword", "op": "eq", "val": 1}]},
                    {"syscall": "fcntl", "args": [
                        {"index": 1, "type": "dword", "op": "eq", "val": 1}]},
                    {"syscall": "mmap", "args": [
                        {"index": 2, "type": "qword", "op": "lt", "val": 4},
                        {"index": 3, "type": "qword", "op": "ge", "val": 4294967297u64}]},
                    {"syscall": "mprotect", "args": [
                        {"index": 2, "type": "qword", "op": "le", "val": 3},
                        {"index": 0, "type": "qword", "op": "gt", "val": 8589934592u64}]},
                    {"syscall": "clone", "args": [
                        {"index": 0, "type": "qword", "op": {"masked_eq": 2114060288},
                         "val": 0}]},
                    {"syscall": "kill", "args": [
                        {"index": 0, "type": "dword", "op": "eq", "val": 0}]},
                    {"syscall": "kill"},
                    {"syscall": "prlimit64", "args": [
                        {"index": 0, "type": "qword", "op": "eq", "val": 0},
                        {"index": 2, "type": "qword", "op": "eq", "val": 0}]},
                    {"syscall": "getpid"}
                ]
            },
            "denylist": {
                "mismatch_action": "allow",
                "match_action": "kill_process",
                "filter": [{"syscall": "ptrace"}, {"syscall": "kexec_load"}]
            },
            "trapping": {
                "mismatch_action": "trap",
                "match_action": "log",
                "filter": [{"syscall": "uname", "args": [
                    {"index": 0, "type": "qword", "op": "ne", "val": 0}]}]
            },
            "empty": {"mismatch_action": {"errno": 38}, "match_action": "allow", "filter": []}
        });
        assert_same_decisions(&policy);
    }

    /// Compares `merged_program(first, last)` with what the kernel decides when both of
    /// seccompiler's programs are installed, `first` then `last`, over the numbers and
    /// argument vectors of [`assert_same_decisions`].
    fn assert_merged_decides_as_both(policy: &Value, first: &str, last: &str) -> BpfProgram {
        let text = policy.to_string();
        let linear = seccompiler::compile_from_json(text.as_bytes(), TargetArch::x86_64)
            .expect("the test policy compiles");
        let merged = merged_program(&policy[first], &policy[last], TargetArch::x86_64)
            .expect("the filters merge");
        let values = argument_values(policy);
        for (nr, arch, calls) in calls_of_every_number(&values) {
            for call in &calls {
                let both = kernel_pick(&[run(&linear[last], call).0, run(&linear[first], call).0]);
                assert_eq!(
                    run(&merged, call).0,
                    both,
                    "nr {nr:#x}, arch {arch:#x}, args {:x?}",
                    call.args
                );
            }
        }
        merged
    }

    #[test]
    fn the_kernel_picks_the_most_severe_action_and_the_latest_filter_among_equals() {
        let (kill_process, kill_thread, trap) = (0x8000_0000, 0, 0x0003_0000);
        let (eperm, enosys, log) = (0x0005_0001, 0x0005_0026, 0x7ffc_0000);
        assert_eq!(kernel_pick(&[]), RET_ALLOW);
        assert_eq!(kernel_pick(&[RET_ALLOW, log]), log);
        assert_eq!(kernel_pick(&[eperm, trap]), trap);
        assert_eq!(kernel_pick(&[kill_thread, kill_process]), kill_process);
        assert_eq!(kernel_pick(&[enosys, eperm]), enosys);
        assert_eq!(kernel_pick(&[eperm, enosys]), eperm);
    }

    #[test]
    fn the_built_in_filters_merge_into_one_program_that_decides_as_both() {
        let policy: Value = serde_json::from_str(crate::confine::policy::DEFAULT_SECCOMP_X86_64)
            .expect("the built-in policy is JSON");
        let [first, last] = crate::confine::policy::FILTER_ORDER;
        let merged = assert_merged_decides_as_both(&policy, first, last);
        // clone3 is allowed by `main` and answered ENOSYS by `overrides`: ENOSYS, so libc falls
        // back to clone, whose flags `main` checks.
        let clone3 = Call {
            nr: 435,
            arch: AUDIT_ARCH_X86_64,
            args: [0; 6],
        };
        assert_eq!(run(&merged, &clone3).0, 0x0005_0026);
    }

    #[test]
    fn filters_with_every_action_merge_where_each_call_has_one_answer() {
        let policy = json!({
            "first": {
                "mismatch_action": "allow",
                "match_action": "kill_process",
                "filter": [{"syscall": "ptrace"}, {"syscall": "read"}, {"syscall": "uname"},
                           {"syscall": "getpid"}]
            },
            "last": {
                "mismatch_action": {"errno": 1},
                "match_action": "allow",
                "filter": [
                    {"syscall": "read"},
                    {"syscall": "write"},
                    {"syscall": "getpid"},
                    {"syscall": "ioctl", "args": [
                        {"index": 1, "type": "dword", "op": "ne", "val": 21522}]},
                    {"syscall": "clone", "args": [
                        {"index": 0, "type": "qword", "op": {"masked_eq": 2114060288},
                         "val": 0}]}
                ]
            },
            "trapping": {
                "mismatch_action": "allow",
                "match_action": "trap",
                "filter": [{"syscall": "write"}, {"syscall": "kill"}]
            },
            "erring": {
                "mismatch_action": {"errno": 38},
                "match_action": "log",
                "filter": [{"syscall": "write"}, {"syscall": "ioctl"}, {"syscall": "kill"}]
            }
        });
        assert_merged_decides_as_both(&policy, "first", "last");
        assert_merged_decides_as_both(&policy, "trapping", "last");
        assert_merged_decides_as_both(&policy, "trapping", "first");
        assert_merged_decides_as_both(&policy, "erring", "trapping");
    }

    #[test]
    fn filters_that_are_not_one_choice_per_number_stay_two_programs() {
        let conditional = json!({
            "mismatch_action": "allow",
            "match_action": "kill_process",
            "filter": [{"syscall": "ioctl", "args": [
                {"index": 1, "type": "dword", "op": "eq", "val": 1}]}]
        });
        let plain = json!({
            "mismatch_action": {"errno": 1},
            "match_action": "allow",
            "filter": [{"syscall": "read"}]
        });
        // The first filter checks arguments: which of its answers applies is not a number's.
        assert!(matches!(
            merged_program(&conditional, &plain, TargetArch::x86_64),
            Err(SearchError::NotMergeable(_))
        ));
        // The first denies (by default) a call whose arguments the last one checks.
        assert!(matches!(
            merged_program(&plain, &conditional, TargetArch::x86_64),
            Err(SearchError::NotMergeable(_))
        ));
    }

    #[test]
    fn a_rule_without_a_syscall_name_is_refused_not_guessed() {
        let filter = json!({"mismatch_action": "allow", "match_action": "log",
                            "filter": [{"args": []}]});
        assert!(matches!(
            searched_program(&filter, TargetArch::x86_64),
            Err(SearchError::Shape)
        ));
    }
}
