//! `bench --measure-against`: nccl-tests `alltoall_perf` output beside the
//! model, and parameters fitted to it. tests/data/alltoall_perf_8x8.txt is
//! in the exact format of nccl-tests' output table (its README's), with
//! synthetic values from a known line (goodput 0.9, 117 us fixed cost).

mod common;
use common::{root, run};

#[test]
fn measured_rows_get_predictions_and_a_fit() {
    let dir = std::env::temp_dir().join(format!("switchyard-measure-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let t = dir.join("t.json").display().to_string();
    let (c, _, e) = run(&[
        "topology", "--preset", "dgx-h100", "--nodes", "8", "--out", &t,
    ]);
    assert_eq!(c, 0, "{e}");
    let data = root("tests/data/alltoall_perf_8x8.txt");
    let (c, out, e) = run(&["bench", "--measure-against", &data, "--topology", &t]);
    assert_eq!(c, 0, "{e}");
    // Seven rows, each with the model beside it.
    let rows: Vec<&str> = out
        .lines()
        .filter(|l| l.trim_start().starts_with(|ch: char| ch.is_ascii_digit()))
        .collect();
    assert_eq!(rows.len(), 7, "{out}");
    assert!(rows[3].trim_start().starts_with("8388608"), "{out}");
    let cols: Vec<f64> = rows[3]
        .split_whitespace()
        .map(|x| x.parse().unwrap())
        .collect();
    assert_eq!(cols[1], 280.1);
    assert!(cols[3] > 0.0 && cols[4] > 0.0, "{out}");
    // The fit recovers the line the sample was made from.
    let fit = out.lines().find(|l| l.starts_with("fitted")).expect(&out);
    let after = |key: &str| -> f64 {
        let i = fit.find(key).expect(fit) + key.len();
        let w = fit[i..].split_whitespace().next().unwrap();
        w.trim_end_matches(',').parse().unwrap()
    };
    let goodput = after("NIC goodput ");
    assert!((goodput - 0.9).abs() < 0.02, "{fit}");
    let per_message = after("per-message cost ");
    assert!(per_message > 1.5 && per_message < 2.3, "{fit}");
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn bad_measurement_files_are_input_errors() {
    let dir = std::env::temp_dir().join(format!("switchyard-measure-bad-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let t = dir.join("t.json").display().to_string();
    let (c, _, _) = run(&[
        "topology", "--preset", "dgx-h100", "--nodes", "2", "--out", &t,
    ]);
    assert_eq!(c, 0);
    let f = dir.join("bad.txt");
    std::fs::write(&f, "# header\n1024 16 float none -1 oops 1 1 0\n").unwrap();
    let (c, _, e) = run(&[
        "bench",
        "--measure-against",
        &f.display().to_string(),
        "--topology",
        &t,
    ]);
    assert_eq!(c, 2, "{e}");
    assert!(e.contains("line 2: time `oops` is not a number"), "{e}");
    let (c, _, e) = run(&["bench", "--measure-against", &f.display().to_string()]);
    assert_eq!(c, 2, "{e}");
    std::fs::remove_dir_all(&dir).ok();
}

/// `simulate --nic-goodput --per-message-us` applies a fitted calibration:
/// goodput 1 and no per-message cost is the line-rate model.
#[test]
fn simulate_takes_a_fitted_calibration() {
    let dir = std::env::temp_dir().join(format!("switchyard-measure-sim-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let f = |n: &str| dir.join(n).display().to_string();
    let (t, m, p) = (f("t.json"), f("m.json"), f("p.json"));
    let steps: [&[&str]; 3] = [
        &[
            "topology",
            "--preset",
            "dgx-h100",
            "--nodes",
            "2",
            "--gpus-per-node",
            "4",
            "--out",
            &t,
        ],
        &[
            "traffic",
            "--ranks",
            "8",
            "--pattern",
            "zipf:1.0",
            "--out",
            &m,
        ],
        &[
            "compile",
            "--topology",
            &t,
            "--traffic",
            &m,
            "--algorithm",
            "pxn",
            "--out",
            &p,
        ],
    ];
    for args in steps {
        let (c, _, e) = run(args);
        assert_eq!(c, 0, "{args:?}: {e}");
    }
    let completion = |extra: &[&str]| -> f64 {
        let mut args = vec![
            "simulate",
            "--topology",
            &t,
            "--traffic",
            &m,
            "--plan",
            &p,
            "--json",
        ];
        args.extend(extra);
        let (c, out, e) = run(&args);
        assert_eq!(c, 0, "{args:?}: {e}");
        let v: serde_json::Value = serde_json::from_str(&out).unwrap();
        v["completion_us"].as_f64().unwrap()
    };
    let ideal = completion(&["--network", "ideal"]);
    let line = completion(&["--nic-goodput", "1", "--per-message-us", "0"]);
    let calibrated = completion(&[]);
    assert!((line - ideal).abs() <= 1e-9 * ideal, "{line} {ideal}");
    assert!(calibrated > 1.1 * ideal, "{calibrated} {ideal}");
    for (extra, want) in [
        (
            &["--nic-goodput", "0"][..],
            "--nic-goodput: must be in (0, 1]",
        ),
        (
            &["--per-message-us", "-1"][..],
            "--per-message-us: must be zero or positive",
        ),
        (
            &["--network", "ideal", "--nic-goodput", "0.9"][..],
            "the ideal network runs at line rate",
        ),
    ] {
        let mut args = vec!["simulate", "--topology", &t, "--traffic", &m, "--plan", &p];
        args.extend(extra);
        let (c, _, e) = run(&args);
        assert_eq!(c, 2, "{args:?}: {e}");
        assert!(e.contains(want), "{args:?}: {e}");
    }
    std::fs::remove_dir_all(&dir).ok();
}
