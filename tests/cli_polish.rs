//! First use, end to end (issue 23 §2 and §3): what `compile` prints, traffic
//! matrices in the forms people have them, flags a pattern ignores, XML
//! inputs to `simulate` and `verify`, `--out -`, and the simulated timeline
//! as a Chrome trace and an SVG.

mod common;

use std::collections::{HashMap, HashSet};

use common::{root, run, Scratch};
use serde_json::Value;

/// A scratch directory for one test, removed when it passes.
fn scratch(name: &str) -> Scratch {
    Scratch::new(&format!("polish-{name}"))
}

fn s(p: &std::path::Path) -> String {
    p.display().to_string()
}

const TOPO: &str = "examples/topologies/dgx-h100-2x8.json";

/// A 16-rank MoE matrix small enough to compile and simulate in a blink.
fn traffic(dir: &std::path::Path, name: &str) -> String {
    let p = s(&dir.join(name));
    let (code, _, err) = run(&[
        "traffic",
        "--ranks",
        "16",
        "--pattern",
        "zipf:1.2",
        "--tokens",
        "64",
        "--hidden",
        "512",
        "--seed",
        "3",
        "--out",
        &p,
    ]);
    assert_eq!(code, 0, "{err}");
    p
}

#[test]
fn compile_summary_line_has_the_simulated_time_bound_and_ratio() {
    let dir = scratch("summary");
    let m = traffic(&dir, "m.json");
    let plan = s(&dir.join("plan.json"));
    let report = s(&dir.join("report.json"));
    let (code, out, err) = run(&[
        "compile",
        "--topology",
        &root(TOPO),
        "--traffic",
        &m,
        "--algorithm",
        "fast",
        "--out",
        &plan,
        "--report",
        &report,
    ]);
    assert_eq!(code, 0, "{err}");
    assert!(out.is_empty(), "{out}");
    // One line: no progress output when stderr is not a terminal.
    assert_eq!(err.lines().count(), 1, "{err}");
    let r: Value = serde_json::from_str(&std::fs::read_to_string(&report).unwrap()).unwrap();
    let want = format!(
        "simulated {:.1} us (calibrated network), lower bound {:.1} us, ratio {:.3}",
        r["completion_us"].as_f64().unwrap(),
        r["lower_bound_us"].as_f64().unwrap(),
        r["ratio_to_bound"].as_f64().unwrap()
    );
    assert!(err.contains(&want), "{err} lacks {want}");
    assert!(r["ratio_to_bound"].as_f64().unwrap() >= 1.0);
    // `simulate` of the written plan agrees with the summary.
    let (code, out, err) = run(&[
        "simulate",
        "--topology",
        &root(TOPO),
        "--traffic",
        &m,
        "--plan",
        &plan,
        "--json",
    ]);
    assert_eq!(code, 0, "{err}");
    let sim: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(sim["completion_us"], r["completion_us"]);
}

#[test]
fn out_dash_writes_the_plan_to_stdout() {
    let dir = scratch("stdout");
    let m = traffic(&dir, "m.json");
    let (code, out, err) = run(&[
        "compile",
        "--topology",
        &root(TOPO),
        "--traffic",
        &m,
        "--algorithm",
        "direct",
        "--out",
        "-",
    ]);
    assert_eq!(code, 0, "{err}");
    let plan: Value = serde_json::from_str(&out).expect("stdout holds the JSON plan alone");
    assert_eq!(plan["ranks"], 16);
    assert!(err.starts_with("<stdout>: "), "{err}");
    // And a generated matrix, piped the same way.
    let (code, out, _) = run(&[
        "traffic",
        "--ranks",
        "4",
        "--pattern",
        "uniform",
        "--out",
        "-",
    ]);
    assert_eq!(code, 0);
    assert!(out.contains("\"matrix\""), "{out}");
}

#[test]
fn traffic_files_in_the_forms_people_have() {
    let dir = scratch("forms");
    // --out m.csv writes CSV, m.tsv TSV; both read back as the JSON does.
    let json = traffic(&dir, "m.json");
    let csv = traffic(&dir, "m.csv");
    let tsv = traffic(&dir, "m.tsv");
    let text = std::fs::read_to_string(&csv).unwrap();
    assert_eq!(text.lines().count(), 16, "{text}");
    assert!(!text.contains('{') && text.lines().all(|l| l.split(',').count() == 16));
    assert!(std::fs::read_to_string(&tsv).unwrap().contains('\t'));
    let rows: Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let rows = rows["matrix"].as_array().unwrap().clone();
    // A header row, whole-number floats, a bare JSON list of rows.
    let with_header = dir.join("header.csv");
    let header: Vec<String> = (0..16).map(|r| format!("rank{r}")).collect();
    std::fs::write(&with_header, format!("{}\n{text}", header.join(","))).unwrap();
    let floats = dir.join("floats.json");
    let as_floats: Vec<Vec<f64>> = rows
        .iter()
        .map(|r| {
            r.as_array()
                .unwrap()
                .iter()
                .map(|v| v.as_f64().unwrap())
                .collect()
        })
        .collect();
    let float_text = serde_json::to_string(&as_floats).unwrap();
    assert!(float_text.contains(".0"), "{float_text}");
    std::fs::write(&floats, float_text).unwrap();
    let mut reports = Vec::new();
    for m in [json, csv, tsv, s(&with_header), s(&floats)] {
        let plan = s(&dir.join("p.json"));
        let (code, _, err) = run(&[
            "compile",
            "--topology",
            &root(TOPO),
            "--traffic",
            &m,
            "--out",
            &plan,
        ]);
        assert_eq!(code, 0, "{m}: {err}");
        let (code, out, err) = run(&[
            "simulate",
            "--topology",
            &root(TOPO),
            "--traffic",
            &m,
            "--plan",
            &plan,
            "--json",
        ]);
        assert_eq!(code, 0, "{m}: {err}");
        let r: Value = serde_json::from_str(&out).unwrap();
        reports.push((m, r["total_bytes"].clone(), r["completion_us"].clone()));
    }
    for r in &reports[1..] {
        assert_eq!(
            (&r.1, &r.2),
            (&reports[0].1, &reports[0].2),
            "{} differs",
            r.0
        );
    }
}

#[test]
fn shape_errors_say_what_is_wrong() {
    let dir = scratch("shapes");
    let bad = dir.join("wide.csv");
    std::fs::write(&bad, "1,2,3\n4,5,6\n").unwrap();
    let (code, _, err) = run(&[
        "compile",
        "--topology",
        &root(TOPO),
        "--traffic",
        &s(&bad),
        "--out",
        &s(&dir.join("p.json")),
    ]);
    assert_eq!(code, 2);
    assert!(err.contains("is not square: 2 rows of 3 values"), "{err}");
    let headed = dir.join("headed.csv");
    std::fs::write(&headed, "src,dst,bytes\n0,1,5\n1,0,7\n").unwrap();
    let (code, _, err) = run(&[
        "compile",
        "--topology",
        &root(TOPO),
        "--traffic",
        &s(&headed),
        "--out",
        &s(&dir.join("p.json")),
    ]);
    assert_eq!(code, 2);
    assert!(err.contains("line 1 was read as a header"), "{err}");
}

#[test]
fn a_flag_the_pattern_ignores_is_an_error() {
    for (args, flag) in [
        (
            &["--pattern", "zipf:1.2", "--bytes", "65536"][..],
            "--bytes",
        ),
        (&["--pattern", "uniform", "--tokens", "64"][..], "--tokens"),
        (&["--pattern", "zipf:1.2", "--skew", "0.5"][..], "--skew"),
        (
            &["--pattern", "lognormal:0.5", "--gpus-per-node", "4"][..],
            "--gpus-per-node",
        ),
    ] {
        let mut a = vec!["traffic", "--ranks", "8"];
        a.extend_from_slice(args);
        let (code, out, err) = run(&a);
        assert_eq!(code, 2, "{a:?}: {err}");
        assert!(out.is_empty());
        assert!(
            err.starts_with(&format!("switchyard: error: {flag}: the `"))
                && err.contains("ignores it"),
            "{a:?}: {err}"
        );
    }
    // The flags a pattern reads still work.
    let (code, _, err) = run(&[
        "traffic",
        "--ranks",
        "8",
        "--pattern",
        "uniform",
        "--bytes",
        "64",
    ]);
    assert_eq!(code, 0, "{err}");
    let (code, _, err) = run(&[
        "traffic",
        "--ranks",
        "8",
        "--format",
        "json",
        "--out",
        "/tmp/x.csv",
    ]);
    assert_eq!(code, 2);
    assert!(err.contains("read back as csv"), "{err}");
}

#[test]
fn simulate_and_verify_take_the_same_inputs_for_xml() {
    let dir = scratch("xml");
    let m = traffic(&dir, "m.json");
    let xml = s(&dir.join("plan.xml"));
    let (code, _, err) = run(&[
        "compile",
        "--topology",
        &root(TOPO),
        "--traffic",
        &m,
        "--algorithm",
        "fast",
        "--out",
        &xml,
    ]);
    assert_eq!(code, 0, "{err}");
    let topo = root(TOPO);
    for cmd in ["verify", "simulate"] {
        // Without --traffic (the matrix the file implies) and with it.
        for with in [false, true] {
            let mut a = vec![cmd, "--plan", &xml, "--topology", &topo];
            if with {
                a.extend(["--traffic", &m]);
            }
            let (code, out, err) = run(&a);
            assert_eq!(code, 0, "{a:?}: {err}");
            assert!(!out.is_empty());
        }
    }
    // A JSON plan still needs its matrix, for both.
    let plan = s(&dir.join("plan.json"));
    run(&[
        "compile",
        "--topology",
        &root(TOPO),
        "--traffic",
        &m,
        "--out",
        &plan,
    ]);
    for cmd in ["verify", "simulate"] {
        let (code, _, err) = run(&[cmd, "--plan", &plan, "--topology", &root(TOPO)]);
        assert_eq!(code, 2, "{cmd}: {err}");
        assert!(
            err.contains("--traffic is required for a .json plan"),
            "{err}"
        );
    }
}

#[test]
fn demo_warns_about_debug_compile_times_only_in_a_debug_build() {
    let (code, out, err) = run(&["demo", "--nodes", "1"]);
    assert_eq!(code, 0, "{err}");
    // The test binary and the CLI are built with the same profile.
    assert_eq!(
        out.contains("from a debug build is slower"),
        cfg!(debug_assertions),
        "{out}"
    );
}

/// The trace against the rules of the Chrome trace event format: valid JSON,
/// a `traceEvents` array, the fields each phase requires, known phases,
/// non-negative durations, every pid named, and every transfer once.
#[test]
fn trace_follows_the_event_format_and_holds_every_transfer_once() {
    let dir = scratch("trace");
    let m = traffic(&dir, "m.json");
    let plan = s(&dir.join("plan.json"));
    let (code, _, err) = run(&[
        "compile",
        "--topology",
        &root(TOPO),
        "--traffic",
        &m,
        "--algorithm",
        "fast",
        "--out",
        &plan,
    ]);
    assert_eq!(code, 0, "{err}");
    let trace = dir.join("plan.trace.json");
    let svg = dir.join("plan.svg");
    let (code, _, err) = run(&[
        "simulate",
        "--topology",
        &root(TOPO),
        "--traffic",
        &m,
        "--plan",
        &plan,
        "--network",
        "congested",
        "--trace",
        &s(&trace),
        "--svg",
        &s(&svg),
    ]);
    assert_eq!(code, 0, "{err}");
    let n = serde_json::from_str::<Value>(&std::fs::read_to_string(&plan).unwrap()).unwrap()
        ["transfers"]
        .as_array()
        .unwrap()
        .len();
    let v: Value = serde_json::from_str(&std::fs::read_to_string(&trace).unwrap()).unwrap();
    let events = v["traceEvents"].as_array().expect("traceEvents array");
    let mut seen = vec![0u32; n];
    let mut named: HashSet<u64> = HashSet::new();
    let mut used: HashSet<u64> = HashSet::new();
    let mut threads: HashMap<(u64, u64), Vec<(f64, f64)>> = HashMap::new();
    for e in events {
        let ph = e["ph"].as_str().expect("ph");
        let pid = e["pid"].as_u64().expect("pid");
        let tid = e["tid"].as_u64().expect("tid");
        assert!(e["name"].is_string(), "{e}");
        match ph {
            "M" => {
                let name = e["name"].as_str().unwrap();
                assert!(
                    ["process_name", "thread_name", "process_sort_index"].contains(&name),
                    "{e}"
                );
                if name == "process_name" {
                    assert!(e["args"]["name"].is_string(), "{e}");
                    named.insert(pid);
                }
            }
            "X" => {
                let ts = e["ts"].as_f64().expect("ts");
                let dur = e["dur"].as_f64().expect("dur");
                assert!(ts >= 0.0 && dur >= 0.0, "{e}");
                let args = &e["args"];
                for k in ["bytes", "step", "transfer", "rate_gbps"] {
                    assert!(args.get(k).is_some(), "{e} lacks {k}");
                }
                seen[args["transfer"].as_u64().unwrap() as usize] += 1;
                used.insert(pid);
                threads.entry((pid, tid)).or_default().push((ts, ts + dur));
            }
            other => panic!("unexpected phase {other}"),
        }
    }
    assert!(seen.iter().all(|&c| c == 1), "every transfer exactly once");
    assert!(used.is_subset(&named), "every track has a name");
    for iv in threads.values_mut() {
        iv.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.total_cmp(&b.1)));
        assert!(
            iv.windows(2).all(|w| w[1].0 >= w[0].1),
            "slices overlap on a thread"
        );
    }
    let svg = std::fs::read_to_string(&svg).unwrap();
    assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"));
    assert!(svg.contains("NIC nic") && svg.contains("Link utilisation over time"));
    // On stdout the trace is alone there; the summary moves to stderr.
    let (code, out, err) = run(&[
        "simulate",
        "--topology",
        &root(TOPO),
        "--traffic",
        &m,
        "--plan",
        &plan,
        "--trace",
        "-",
    ]);
    assert_eq!(code, 0, "{err}");
    let piped: Value = serde_json::from_str(&out).expect("stdout is the trace alone");
    let slices = piped["traceEvents"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["ph"] == "X");
    assert_eq!(slices.count(), n);
    assert!(err.contains("completion"), "{err}");
}

/// Issue 23 §1 item 7: when `lp`'s time limit runs out, the summary line
/// says what happened to the solve, and the plan is still correct.
#[test]
fn lp_says_when_its_time_limit_ran_out() {
    let dir = scratch("lp-limit");
    let topo = dir.join("t.json");
    std::fs::write(
        &topo,
        r#"{"name":"idle","nodes":2,"gpus_per_node":1,
            "intra":{"kind":"switch","bandwidth_GBps":450,"latency_us":1},
            "nic":{"per_node":4096,"bandwidth_GBps":50,"latency_us":3}}"#,
    )
    .unwrap();
    let m = dir.join("m.json");
    std::fs::write(&m, "[[0, 1000000], [1000000, 0]]").unwrap();
    let plan = s(&dir.join("p.json"));
    let (code, _, err) = run(&[
        "compile",
        "--topology",
        &s(&topo),
        "--traffic",
        &s(&m),
        "--algorithm",
        "lp",
        "--time-limit",
        "0.000001",
        "--out",
        &plan,
    ]);
    assert_eq!(code, 0, "{err}");
    assert!(
        err.contains("lp: the time limit of 0.000001 s ran out before HiGHS held a flow"),
        "{err}"
    );
    let (code, _, err) = run(&[
        "verify",
        "--plan",
        &plan,
        "--traffic",
        &s(&m),
        "--topology",
        &s(&topo),
    ]);
    assert_eq!(code, 0, "{err}");
    // With time enough the solve ends optimal and says nothing more.
    let (code, _, err) = run(&[
        "compile",
        "--topology",
        &s(&topo),
        "--traffic",
        &s(&m),
        "--algorithm",
        "lp",
        "--out",
        &plan,
    ]);
    assert_eq!(code, 0, "{err}");
    assert!(!err.contains("lp: the time limit"), "{err}");
}
