//! The writer: an [`Algo`] as text the executor's hand-written reader takes.
//!
//! quick-xml does the element syntax; the lexical rules of spec §2 (no
//! prolog, no tabs, one tag per line, single spaces, double quotes, decimal
//! numbers) follow from how it is driven here, and [`super::exec`] checks them
//! on every file the tests write. Attribute order is msccl-tools' (spec §12).

use quick_xml::events::{BytesEnd, BytesStart, BytesText, Event};
use quick_xml::Writer;

use super::{Algo, Gpu, Step, Tb};

/// The file's text. Skewed plans carry their chunk matrix in comments, one
/// per source rank, which the executor skips and [`super::read`] reads back.
pub fn write_algo(algo: &Algo) -> String {
    let mut w = Writer::new_with_indent(Vec::new(), b' ', 2);
    let mut el = BytesStart::new("algo");
    let num = |x: i64| x.to_string();
    el.push_attribute(("name", algo.name.as_str()));
    el.push_attribute(("proto", algo.proto.name()));
    el.push_attribute(("nchannels", num(algo.nchannels).as_str()));
    el.push_attribute(("nchunksperloop", num(algo.nchunksperloop).as_str()));
    el.push_attribute(("ngpus", num(algo.ngpus).as_str()));
    el.push_attribute(("coll", algo.coll.as_str()));
    el.push_attribute(("inplace", flag(algo.inplace)));
    el.push_attribute(("outofplace", flag(algo.outofplace)));
    el.push_attribute(("minBytes", num(algo.min_bytes).as_str()));
    el.push_attribute(("maxBytes", num(algo.max_bytes).as_str()));
    emit(&mut w, Event::Start(el));
    if let Some(rows) = &algo.chunks {
        for (s, row) in rows.iter().enumerate() {
            let cells: Vec<String> = row.iter().map(u32::to_string).collect();
            let text = format!(" chunks from {s}: {} ", cells.join(" "));
            emit(&mut w, Event::Comment(BytesText::from_escaped(text)));
        }
    }
    for gpu in &algo.gpus {
        write_gpu(&mut w, gpu);
    }
    emit(&mut w, Event::End(BytesEnd::new("algo")));
    let mut text = String::from_utf8(w.into_inner()).expect("the writer is fed only ASCII");
    text.push('\n');
    text
}

fn write_gpu(w: &mut Writer<Vec<u8>>, gpu: &Gpu) {
    let mut el = BytesStart::new("gpu");
    el.push_attribute(("id", gpu.id.to_string().as_str()));
    el.push_attribute(("i_chunks", gpu.i_chunks.to_string().as_str()));
    el.push_attribute(("o_chunks", gpu.o_chunks.to_string().as_str()));
    el.push_attribute(("s_chunks", gpu.s_chunks.to_string().as_str()));
    emit(w, Event::Start(el));
    for tb in &gpu.tbs {
        write_tb(w, tb);
    }
    emit(w, Event::End(BytesEnd::new("gpu")));
}

fn write_tb(w: &mut Writer<Vec<u8>>, tb: &Tb) {
    let mut el = BytesStart::new("tb");
    el.push_attribute(("id", tb.id.to_string().as_str()));
    el.push_attribute(("send", tb.send.to_string().as_str()));
    el.push_attribute(("recv", tb.recv.to_string().as_str()));
    el.push_attribute(("chan", tb.chan.to_string().as_str()));
    emit(w, Event::Start(el));
    for step in &tb.steps {
        emit(w, Event::Empty(step_element(step)));
    }
    emit(w, Event::End(BytesEnd::new("tb")));
}

fn step_element(st: &Step) -> BytesStart<'static> {
    let mut el = BytesStart::new("step");
    el.push_attribute(("s", st.s.to_string().as_str()));
    el.push_attribute(("type", st.kind.code()));
    el.push_attribute(("srcbuf", st.srcbuf.letter()));
    el.push_attribute(("srcoff", st.srcoff.to_string().as_str()));
    el.push_attribute(("dstbuf", st.dstbuf.letter()));
    el.push_attribute(("dstoff", st.dstoff.to_string().as_str()));
    el.push_attribute(("cnt", st.cnt.to_string().as_str()));
    el.push_attribute(("depid", st.depid.to_string().as_str()));
    el.push_attribute(("deps", st.deps.to_string().as_str()));
    el.push_attribute(("hasdep", flag(st.hasdep)));
    el
}

fn flag(b: bool) -> &'static str {
    if b {
        "1"
    } else {
        "0"
    }
}

fn emit(w: &mut Writer<Vec<u8>>, e: Event<'_>) {
    // Writing into a Vec cannot fail.
    w.write_event(e).expect("writing XML into memory");
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::msccl::{BufRef, Protocol, StepKind};

    #[test]
    fn writes_the_executor_form() {
        let algo = Algo {
            name: "t".into(),
            proto: Protocol::Simple,
            nchannels: 1,
            nchunksperloop: 2,
            ngpus: 2,
            coll: "alltoall".into(),
            inplace: false,
            outofplace: true,
            min_bytes: 0,
            max_bytes: 0,
            chunks: Some(vec![vec![1, 1], vec![1, 0]]),
            line: 0,
            gpus: vec![Gpu {
                id: 0,
                i_chunks: 2,
                o_chunks: 2,
                s_chunks: 0,
                line: 0,
                tbs: vec![Tb {
                    id: 0,
                    send: 1,
                    recv: -1,
                    chan: 0,
                    line: 0,
                    steps: vec![Step {
                        s: 0,
                        kind: StepKind::Send,
                        srcbuf: BufRef::Input,
                        srcoff: 1,
                        dstbuf: BufRef::Output,
                        dstoff: 0,
                        cnt: 1,
                        depid: -1,
                        deps: -1,
                        hasdep: false,
                        line: 0,
                    }],
                }],
            }],
        };
        let text = write_algo(&algo);
        let expected = r#"<algo name="t" proto="Simple" nchannels="1" nchunksperloop="2" ngpus="2" coll="alltoall" inplace="0" outofplace="1" minBytes="0" maxBytes="0">
  <!-- chunks from 0: 1 1 -->
  <!-- chunks from 1: 1 0 -->
  <gpu id="0" i_chunks="2" o_chunks="2" s_chunks="0">
    <tb id="0" send="1" recv="-1" chan="0">
      <step s="0" type="s" srcbuf="i" srcoff="1" dstbuf="o" dstoff="0" cnt="1" depid="-1" deps="-1" hasdep="0"/>
    </tb>
  </gpu>
</algo>
"#;
        assert_eq!(text, expected);
    }
}
