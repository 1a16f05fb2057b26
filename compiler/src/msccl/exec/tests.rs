//! The executor on small files: loader errors, pairing, deadlocks, and the
//! worklist run held to a sweep of every tb.

use super::*;
use crate::msccl::{check_executable, parse};

const TINY: &str = r#"<algo name="t" proto="Simple" nchannels="1" nchunksperloop="2" ngpus="2" coll="alltoall" inplace="0" outofplace="1" minBytes="0" maxBytes="0">
  <gpu id="0" i_chunks="2" o_chunks="2" s_chunks="0">
    <tb id="0" send="1" recv="-1" chan="0">
      <step s="0" type="s" srcbuf="i" srcoff="1" dstbuf="o" dstoff="0" cnt="1" depid="-1" deps="-1" hasdep="0"/>
    </tb>
    <tb id="1" send="-1" recv="1" chan="0">
      <step s="0" type="r" srcbuf="i" srcoff="0" dstbuf="o" dstoff="1" cnt="1" depid="-1" deps="-1" hasdep="0"/>
    </tb>
    <tb id="2" send="-1" recv="-1" chan="0">
      <step s="0" type="cpy" srcbuf="i" srcoff="0" dstbuf="o" dstoff="0" cnt="1" depid="-1" deps="-1" hasdep="0"/>
    </tb>
  </gpu>
  <gpu id="1" i_chunks="2" o_chunks="2" s_chunks="0">
    <tb id="0" send="0" recv="-1" chan="0">
      <step s="0" type="s" srcbuf="i" srcoff="0" dstbuf="o" dstoff="0" cnt="1" depid="-1" deps="-1" hasdep="0"/>
    </tb>
    <tb id="1" send="-1" recv="0" chan="0">
      <step s="0" type="r" srcbuf="i" srcoff="0" dstbuf="o" dstoff="0" cnt="1" depid="-1" deps="-1" hasdep="0"/>
    </tb>
    <tb id="2" send="-1" recv="-1" chan="0">
      <step s="0" type="cpy" srcbuf="i" srcoff="1" dstbuf="o" dstoff="1" cnt="1" depid="-1" deps="-1" hasdep="0"/>
    </tb>
  </gpu>
</algo>
"#;

fn err(text: &str) -> String {
    check_executable(text).unwrap_err().to_string()
}

#[test]
fn tiny_plan_runs() {
    let r = check_executable(TINY).unwrap();
    assert_eq!(r.operations, 4);
    assert_eq!(r.chunks_moved, 2);
    assert!(r.warnings.is_empty());
}

#[test]
fn lexical_rules() {
    assert!(err(&format!("<?xml version=\"1.0\"?>\n{TINY}")).contains("line 1: XML prolog"));
    assert!(err(&TINY.replacen("  <gpu", "\t<gpu", 1)).contains("line 2: tab"));
    assert!(
        err(&TINY.replacen("name=\"t\" proto", "name=\"t\"  proto", 1))
            .contains("exactly one space")
    );
    assert!(err(&TINY.replacen("name=\"t\"", "name='t'", 1)).contains("double quotes"));
    assert!(err(&TINY.replacen("cnt=\"1\"", "cnt=\"01\"", 1)).contains("decimal"));
    assert!(err(&TINY.replacen("/>\n", "/><!-- x -->\n", 1)).contains("one tag per line"));
}

#[test]
fn mispaired_and_wrong_plans_are_rejected() {
    // Gpu 0 receives into the wrong place.
    let e = err(&TINY.replacen("dstoff=\"1\" cnt=\"1\"", "dstoff=\"0\" cnt=\"1\"", 1));
    assert!(
        e.contains("gpu 0: output chunk 1 is never written; it should hold input chunk 0 of gpu 1"),
        "{e}"
    );
    // Gpu 0 sends the wrong chunk.
    let e = err(&TINY.replacen(
        "srcoff=\"1\" dstbuf=\"o\" dstoff=\"0\"",
        "srcoff=\"0\" dstbuf=\"o\" dstoff=\"0\"",
        1,
    ));
    assert!(e.contains("gpu 1, tb 1, step 0: writes input chunk 0 of gpu 0 into output chunk 0 of gpu 1, which should hold input chunk 1 of gpu 0"), "{e}");
    // One receive removed: the send has no partner.
    let no_recv = TINY.replacen(
        "      <step s=\"0\" type=\"r\" srcbuf=\"i\" srcoff=\"0\" dstbuf=\"o\" dstoff=\"1\" cnt=\"1\" depid=\"-1\" deps=\"-1\" hasdep=\"0\"/>\n",
        "",
        1,
    );
    let e = err(&no_recv);
    assert!(e.contains("gpu 1, tb 0, step 0: operation 1 it sends on channel 0 (1 -> 0) has no partner: gpu 0 receives 0 of 1"), "{e}");
    // A dependency on a step that never signals.
    let e = err(&TINY.replacen(
        "depid=\"-1\" deps=\"-1\" hasdep=\"0\"/>\n    </tb>\n    <tb id=\"2\"",
        "depid=\"0\" deps=\"0\" hasdep=\"0\"/>\n    </tb>\n    <tb id=\"2\"",
        1,
    ));
    assert!(e.contains("wait forever"), "{e}");
    assert!(err(&TINY.replacen("cnt=\"1\"", "cnt=\"72\"", 1)).contains("cnt=\"72\""));
}

#[test]
fn a_lonely_receive_and_mismatched_counts_name_their_step() {
    // Gpu 0's send removed: gpu 1's receive has no partner, and the
    // sender's (empty) tb is named.
    let no_send = TINY.replacen(
        "      <step s=\"0\" type=\"s\" srcbuf=\"i\" srcoff=\"1\" dstbuf=\"o\" dstoff=\"0\" cnt=\"1\" depid=\"-1\" deps=\"-1\" hasdep=\"0\"/>\n",
        "",
        1,
    );
    let e = err(&no_send);
    assert!(e.contains("gpu 1, tb 1, step 0: operation 1 it receives on channel 0 (0 -> 1) has no partner: gpu 0 sends 0 of 1 there (its tb 0 on that channel)"), "{e}");
    // Gpu 1 sends two chunks where gpu 0 receives one.
    let e = err(&TINY.replacen(
        "srcoff=\"0\" dstbuf=\"o\" dstoff=\"0\" cnt=\"1\" depid=\"-1\" deps=\"-1\" hasdep=\"0\"/>\n    </tb>\n    <tb id=\"1\" send=\"-1\" recv=\"0\"",
        "srcoff=\"0\" dstbuf=\"o\" dstoff=\"0\" cnt=\"2\" depid=\"-1\" deps=\"-1\" hasdep=\"0\"/>\n    </tb>\n    <tb id=\"1\" send=\"-1\" recv=\"0\"",
        1,
    ));
    assert!(e.contains("gpu 0, tb 1, step 0: receive 0 on channel 0 from gpu 1 has cnt=\"1\" but its send (gpu 1, tb 0, step 0, line 15) has cnt=\"2\""), "{e}");
}

/// Both gpus of two send `steps` steps of `cnt` chunks to each other,
/// then receive as many, from one tb (three chunks each way).
fn crossed_sends(proto: &str, steps: u32, cnt: u32) -> String {
    let mut text = format!(
        r#"<algo name="t" proto="{proto}" nchannels="1" nchunksperloop="6" ngpus="2" coll="alltoall" inplace="0" outofplace="1" minBytes="0" maxBytes="0">
"#
    );
    for g in 0..2 {
        let peer = 1 - g;
        text.push_str(&format!("  <gpu id=\"{g}\" i_chunks=\"6\" o_chunks=\"6\" s_chunks=\"0\">\n    <tb id=\"0\" send=\"{peer}\" recv=\"{peer}\" chan=\"0\">\n"));
        for k in 0..steps {
            text.push_str(&format!("      <step s=\"{k}\" type=\"s\" srcbuf=\"i\" srcoff=\"{}\" dstbuf=\"o\" dstoff=\"0\" cnt=\"{cnt}\" depid=\"-1\" deps=\"-1\" hasdep=\"0\"/>\n", peer * 3 + k * cnt));
        }
        for k in 0..steps {
            text.push_str(&format!("      <step s=\"{}\" type=\"r\" srcbuf=\"i\" srcoff=\"0\" dstbuf=\"o\" dstoff=\"{}\" cnt=\"{cnt}\" depid=\"-1\" deps=\"-1\" hasdep=\"0\"/>\n", steps + k, peer * 3 + k * cnt));
        }
        text.push_str(&format!("    </tb>\n    <tb id=\"1\" send=\"-1\" recv=\"-1\" chan=\"0\">\n      <step s=\"0\" type=\"cpy\" srcbuf=\"i\" srcoff=\"{0}\" dstbuf=\"o\" dstoff=\"{0}\" cnt=\"3\" depid=\"-1\" deps=\"-1\" hasdep=\"0\"/>\n    </tb>\n  </gpu>\n", g * 3));
    }
    text.push_str("</algo>\n");
    text
}

/// Each operation's dependencies and data after a run.
type Outcome = Vec<(Vec<u32>, Vec<Origin>)>;

/// What a run leaves: each operation's dependencies and data, or the error.
fn outcome(text: &str, order: Order) -> std::result::Result<Outcome, String> {
    let algo = parse::parse_algo(text, "t.xml").map_err(|e| e.to_string())?;
    let l = loaded_run(&algo, "t.xml", order).map_err(|e| e.to_string())?;
    Ok(l.ops.into_iter().map(|o| (o.deps, o.data)).collect())
}

#[test]
fn worklist_run_ends_as_the_sweep_does() {
    use crate::generate::{generate, Pattern, TrafficSpec};
    use crate::msccl::{to_xml, Protocol, XmlOptions};
    use crate::sched::{schedule, Algorithm, Options};
    // Hand-made files: one that runs, deadlocks with one operation per
    // step (Simple) and per chunk only (one 3-chunk step each way), and
    // the same with LL's deeper FIFO, which runs.
    let mut texts = vec![
        TINY.to_string(),
        crossed_sends("Simple", 3, 1),
        crossed_sends("Simple", 1, 3),
        crossed_sends("LL", 3, 1),
    ];
    // Lowered files with waits, relays and FIFO pressure (Simple).
    let topo = crate::Topology::preset("dgx-h100", 2, None).unwrap();
    let mut spec = TrafficSpec::new(16, Pattern::Zipf(1.2));
    spec.bytes = 32 << 10;
    let m = generate(&spec).unwrap();
    for alg in [Algorithm::Fast, Algorithm::Hierarchical] {
        let plan = schedule(alg, &topo, &m, &Options::default()).unwrap();
        let opts = XmlOptions {
            protocol: Some(Protocol::Simple),
            ..XmlOptions::default()
        };
        texts.push(to_xml(&plan, &topo, &m, &opts).unwrap().text);
    }
    for (i, t) in texts.iter().enumerate() {
        let w = outcome(t, Order::Worklist);
        assert_eq!(w, outcome(t, Order::Sweep), "file {i}");
        if let Err(e) = &w {
            assert!(i == 1 || i == 2, "file {i}: {e}");
            assert!(e.contains("deadlock with"), "{e}");
        }
    }
    let per_chunk = outcome(&texts[2], Order::Worklist).unwrap_err();
    assert!(per_chunk.contains("one operation per chunk"), "{per_chunk}");
    assert!(outcome(&texts[1], Order::Worklist).is_err());
    assert!(outcome(&texts[3], Order::Worklist).is_ok());
}

#[test]
fn send_then_receive_in_one_tb_deadlocks() {
    // Both gpus send three chunks one by one to each other, then receive,
    // from one tb: with FIFO depth 2 neither reaches its receives.
    let text = crossed_sends("Simple", 3, 1);
    let e = err(&text);
    assert!(
        e.contains("deadlock with one operation per step (small messages) (Simple FIFO depth 2)"),
        "{e}"
    );
    assert!(e.contains("cannot send to gpu 1 on channel 0"), "{e}");
    // LL's FIFO of 8 holds all three.
    check_executable(&text.replacen("proto=\"Simple\"", "proto=\"LL\"", 1)).unwrap();
}
