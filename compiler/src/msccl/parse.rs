//! The file in: an MSCCL XML file's text into an [`Algo`], under the
//! executor reader's lexical rules (no prolog, BOM, tab, DOCTYPE or entity,
//! one tag per line, ...), and the chunk map its chunk comments and name
//! give. The element tree is read with quick-xml; numbers must be plain
//! decimal, since the executor would read `010` as 8.
//!
//! Nothing here runs the file: [`super::exec`] runs an [`Algo`] and
//! [`super::read`] turns the run into a plan, so data flows
//! parse -> exec -> read.

use std::borrow::Cow;

use quick_xml::events::{BytesStart, Event};
use quick_xml::Reader;
use smallvec::SmallVec;

use super::{Algo, BufRef, ChunkMap, Gpu, NameFacts, Protocol, Step, StepKind, Tb};
use super::{MAX_NODES, MAX_OFFSET};
use crate::error::{clip, InputError, Result};

/// Lexical rules of the executor's reader plus Switchyard's writing rules.
pub fn check_lexical(text: &str, file: &str) -> Result<()> {
    let bad = |line: usize, reason: String| -> crate::error::Error {
        InputError::at(file, format!("line {line}"), reason).into()
    };
    if text.starts_with('\u{feff}') {
        return Err(bad(
            1,
            "byte-order mark: the executor expects '<' first".into(),
        ));
    }
    let mut seen_element = false;
    for (i, raw) in text.split('\n').enumerate() {
        let line = i + 1;
        let l = raw.strip_suffix('\r').unwrap_or(raw);
        if let Some(col) = l.find('\t') {
            return Err(bad(
                line,
                format!(
                    "tab at column {}: the executor's reader rejects tabs",
                    col + 1
                ),
            ));
        }
        let body = l.trim_start_matches(' ');
        if body.is_empty() {
            continue;
        }
        if body.starts_with("<?") {
            return Err(bad(
                line,
                "XML prolog `<?...?>`: the executor reads it as an element and fails; write none"
                    .into(),
            ));
        }
        if !body.starts_with('<') {
            return Err(bad(line, format!("text `{}` between elements", clip(body))));
        }
        if body.ends_with(' ') {
            return Err(bad(line, "trailing space after the tag".into()));
        }
        if let Some(c) = body.strip_prefix("<!--") {
            let Some(inner) = c.strip_suffix("-->") else {
                return Err(bad(
                    line,
                    "a comment must open and close on one line".into(),
                ));
            };
            let first = inner
                .trim_start_matches(' ')
                .split(' ')
                .next()
                .unwrap_or("");
            if !c.starts_with(' ') || first.contains('=') || inner.contains("--") {
                return Err(bad(line, "comment the executor misreads: start it with a space, no `=` in its first word, no `--` inside".into()));
            }
            continue;
        }
        if body.starts_with("<!") {
            return Err(bad(
                line,
                "DOCTYPE or CDATA: the executor's reader has none".into(),
            ));
        }
        lex_tag(body).map_err(|r| bad(line, r))?;
        seen_element = true;
    }
    if !seen_element {
        return Err(bad(1, "no element".into()));
    }
    Ok(())
}

/// One line holding exactly one tag: `<name( key="value")*/?>` or `</name>`.
fn lex_tag(body: &str) -> std::result::Result<(), String> {
    let is_name = |s: &str| {
        !s.is_empty()
            && s.len() < 255
            && s.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-' || b == b'.')
    };
    if let Some(rest) = body.strip_prefix("</") {
        let name = rest
            .strip_suffix('>')
            .ok_or("closing tag must end the line with `>` (one tag per line)")?;
        return if is_name(name) {
            Ok(())
        } else {
            Err(format!("bad closing tag `{}`", clip(body)))
        };
    }
    let inner = body[1..]
        .strip_suffix("/>")
        .or_else(|| body[1..].strip_suffix('>'))
        .ok_or("the tag must end the line with `>` or `/>` (one tag per line)")?;
    let (name, mut attrs) = inner.split_once(' ').unwrap_or((inner, ""));
    if !is_name(name) {
        return Err(format!("bad element name in `{}`", clip(body)));
    }
    let mut count = 0;
    while !attrs.is_empty() {
        let (key, rest) = attrs
            .split_once('=')
            .ok_or_else(|| format!("attribute `{}` has no value", clip(attrs)))?;
        if !is_name(key) {
            return Err(format!("bad attribute name `{}` (attributes are separated by exactly one space, no spaces around `=`)", clip(key)));
        }
        let rest = rest
            .strip_prefix('"')
            .ok_or_else(|| format!("value of `{key}` must be in double quotes"))?;
        let (value, rest) = rest
            .split_once('"')
            .ok_or_else(|| format!("attribute `{key}` has no closing quote"))?;
        if value.len() > 255 {
            return Err(format!(
                "value of `{key}` is longer than the executor's 256-byte buffer"
            ));
        }
        if value.contains('&') || value.contains('<') {
            return Err(format!(
                "value of `{key}` holds `&` or `<`: the executor decodes no entities"
            ));
        }
        count += 1;
        attrs = match rest.strip_prefix(' ') {
            Some(r) if !r.is_empty() && !r.starts_with(' ') => r,
            None if rest.is_empty() => "",
            _ => {
                return Err(format!(
                    "unexpected `{}` after `{key}` (one tag per line, attributes separated by exactly one space)",
                    clip(rest)
                ))
            }
        };
    }
    if count > super::MAX_ATTRS {
        return Err(format!(
            "{count} attributes: the executor keeps only the first {} per element",
            super::MAX_ATTRS
        ));
    }
    Ok(())
}

/// Checks the executor's lexical rules ([`check_lexical`])
/// and reads the element tree. Other elements are skipped with their
/// content, as the executor does; a missing attribute, a non-decimal
/// number or an element left open is an error with its line.
pub fn parse_algo(text: &str, file: &str) -> Result<Algo> {
    check_lexical(text, file)?;
    let lines = LineIndex::new(text);
    let mut r = Reader::from_str(text);
    r.config_mut().trim_text(true);
    let mut algo: Option<Algo> = None;
    // Depth of the handled path: 0 outside, 1 algo, 2 gpu, 3 tb; `skip`
    // counts open unknown elements.
    let mut depth = 0usize;
    let mut skip = 0usize;
    let mut chunk_rows: Vec<(usize, Vec<u32>)> = Vec::new();
    // Elements not yet closed, with their lines: the executor's reader
    // fails at the end of a file that leaves one open.
    let mut open: Vec<(String, usize)> = Vec::new();
    loop {
        let before = r.buffer_position() as usize;
        let ev = r.read_event().map_err(|e| {
            let pos = r.error_position() as usize;
            InputError::at(
                file,
                format!("line {}", lines.line_of(text, pos)),
                format!("not well-formed XML: {e}"),
            )
        })?;
        let line = lines.line_of(text, before);
        let bad = |reason: String| -> crate::error::Error {
            InputError::at(file, format!("line {line}"), reason).into()
        };
        match ev {
            Event::Eof => break,
            Event::Start(ref e) | Event::Empty(ref e) => {
                let empty = matches!(ev, Event::Empty(_));
                let qname = e.name();
                let name: &str = qname.as_ref();
                if !empty {
                    open.push((name.to_string(), line));
                }
                if skip > 0 {
                    if !empty {
                        skip += 1;
                    }
                    continue;
                }
                let attrs = Attrs::new(e, line, file)?;
                match (depth, name) {
                    (0, "algo") => {
                        if algo.is_some() {
                            return Err(bad("a second <algo>: one file holds one".into()));
                        }
                        algo = Some(read_algo_attrs(&attrs)?);
                    }
                    (1, "gpu") => {
                        let a = algo.as_mut().expect("depth 1 is inside algo");
                        a.gpus.push(Gpu {
                            id: attrs.int("id")?,
                            i_chunks: attrs.int("i_chunks")?,
                            o_chunks: attrs.int("o_chunks")?,
                            s_chunks: attrs.int("s_chunks")?,
                            tbs: Vec::new(),
                            line,
                        });
                    }
                    (2, "tb") => {
                        let gpu = last_gpu(&mut algo);
                        gpu.tbs.push(Tb {
                            id: attrs.int("id")?,
                            send: attrs.int("send")?,
                            recv: attrs.int("recv")?,
                            chan: attrs.int("chan")?,
                            steps: Vec::new(),
                            line,
                        });
                    }
                    (3, "step") => {
                        if !empty {
                            return Err(bad("<step> must be empty (`<step .../>`): the executor crashes on children of a step".into()));
                        }
                        let step = read_step(&attrs)?;
                        let tb = last_gpu(&mut algo)
                            .tbs
                            .last_mut()
                            .expect("depth 3 is inside tb");
                        tb.steps.push(step);
                        continue;
                    }
                    (0, _) => {
                        return Err(bad(format!("the first element is <{name}>, not <algo>")))
                    }
                    _ => {
                        if !empty {
                            skip = 1;
                        }
                        continue;
                    }
                }
                if empty {
                    continue;
                }
                depth += 1;
            }
            Event::End(_) => {
                open.pop();
                if skip > 0 {
                    skip -= 1;
                } else {
                    depth = depth.saturating_sub(1);
                }
            }
            Event::Comment(c) => {
                let body: &str = &c;
                if let Some(row) = parse_chunk_comment(body) {
                    let row = row.map_err(bad)?;
                    chunk_rows.push((line, row.1));
                    if row.0 != chunk_rows.len() - 1 {
                        return Err(bad(format!(
                            "chunk comment for rank {} where rank {} was expected",
                            row.0,
                            chunk_rows.len() - 1
                        )));
                    }
                }
            }
            Event::Text(t) => {
                if skip == 0 && !t.chars().all(char::is_whitespace) {
                    return Err(bad(
                        "text between elements: the executor's reader rejects it".into(),
                    ));
                }
            }
            Event::CData(_) => return Err(bad("CDATA: the executor's reader has none".into())),
            Event::Decl(_) | Event::PI(_) | Event::DocType(_) | Event::GeneralRef(_) => {}
        }
    }
    if let Some((name, line)) = open.last() {
        return Err(InputError::at(
            file,
            format!("line {line}"),
            format!("<{name}> is never closed (the file ends first)"),
        )
        .into());
    }
    let mut algo = algo.ok_or_else(|| InputError::new(file, "no <algo> element"))?;
    if !chunk_rows.is_empty() {
        algo.chunks = Some(chunk_rows.into_iter().map(|(_, r)| r).collect());
    }
    Ok(algo)
}

fn last_gpu(algo: &mut Option<Algo>) -> &mut Gpu {
    algo.as_mut()
        .and_then(|a| a.gpus.last_mut())
        .expect("depth 2 is inside gpu")
}

/// ` chunks from S: k0 k1 ... ` → `(S, [k...])`; `None` for any other
/// comment. A comment that starts like one but does not parse, or counts
/// more chunks than offsets address, is an error: it is a damaged file, and
/// reading it as uniform would check the wrong all-to-all.
fn parse_chunk_comment(body: &str) -> Option<std::result::Result<(usize, Vec<u32>), String>> {
    let rest = body.trim().strip_prefix("chunks from ")?;
    let malformed = || format!("malformed chunk comment `{}`", clip(body.trim()));
    let Some((s, cells)) = rest.split_once(':') else {
        return Some(Err(malformed()));
    };
    let Ok(s) = s.parse::<usize>() else {
        return Some(Err(malformed()));
    };
    let mut row = Vec::new();
    for c in cells.split_whitespace() {
        match c.parse::<u32>() {
            Ok(k) if i64::from(k) <= MAX_OFFSET + 1 => row.push(k),
            Ok(_) => {
                return Some(Err(format!(
                    "chunk comment for rank {s}: {k} chunks, more than offsets address ({})",
                    MAX_OFFSET + 1,
                    k = clip(c)
                )))
            }
            Err(_) => return Some(Err(malformed())),
        }
    }
    Some(Ok((s, row)))
}

fn read_algo_attrs(a: &Attrs) -> Result<Algo> {
    let proto = a.get("proto")?;
    let proto: Protocol = proto.parse().map_err(|e: String| a.bad(e))?;
    let name = a.opt("name").unwrap_or_default();
    let facts = NameFacts::parse(name).map_err(|e| a.bad(e))?;
    let ngpus = a.int("ngpus")?;
    if let Some(g) = facts.gpus_per_node.filter(|_| ngpus >= 1) {
        if ngpus % i64::from(g) != 0 {
            return Err(a
                .bad(format!(
                    "gpus_per_node={g} in the name does not split ngpus=\"{ngpus}\" into whole nodes"
                ))
                .into());
        }
    }
    Ok(Algo {
        name: name.to_string(),
        proto,
        nchannels: a.int("nchannels")?,
        nchunksperloop: a.int("nchunksperloop")?,
        ngpus,
        coll: a.get("coll")?.to_string(),
        inplace: a.flag("inplace")?,
        outofplace: a.flag("outofplace")?,
        min_bytes: a.int("minBytes")?,
        max_bytes: a.int("maxBytes")?,
        gpus: Vec::new(),
        chunks: None,
        line: a.line,
    })
}

fn read_step(a: &Attrs) -> Result<Step> {
    let kind = a.get("type")?;
    let kind = StepKind::parse(kind).ok_or_else(|| {
        a.bad(format!(
            "type=\"{}\" is not a step type (s r rcs rrs rrc rrcs cpy re nop)",
            clip(kind)
        ))
    })?;
    let buf = |key: &str| -> Result<BufRef> {
        let v = a.get(key)?;
        BufRef::parse(v).ok_or_else(|| {
            a.bad(format!("{key}=\"{}\" must be i, o or s", clip(v)))
                .into()
        })
    };
    Ok(Step {
        s: a.int("s")?,
        kind,
        srcbuf: buf("srcbuf")?,
        srcoff: a.int("srcoff")?,
        dstbuf: buf("dstbuf")?,
        dstoff: a.int("dstoff")?,
        cnt: a.int("cnt")?,
        depid: a.int("depid")?,
        deps: a.int("deps")?,
        hasdep: a.flag("hasdep")?,
        line: a.line,
    })
}

/// An element's attributes as raw strings (no entity decoding, as the
/// executor), first occurrence wins. Borrowed from the element, held
/// inline: a step's eleven attributes allocate nothing (64 x 8 files hold
/// about a million steps).
struct Attrs<'e, 'f> {
    element: &'e str,
    pairs: SmallVec<[(&'e str, Cow<'e, str>); 12]>,
    line: usize,
    file: &'f str,
}

impl<'e, 'f> Attrs<'e, 'f> {
    fn new(e: &'e BytesStart<'_>, line: usize, file: &'f str) -> Result<Attrs<'e, 'f>> {
        let element: &str = e.name().0;
        let mut pairs = SmallVec::new();
        for a in e.attributes() {
            let a = a.map_err(|err| {
                InputError::at(
                    file,
                    format!("line {line}"),
                    format!("<{element}>: bad attribute: {err}"),
                )
            })?;
            pairs.push((a.key.0, a.value));
        }
        Ok(Attrs {
            element,
            pairs,
            line,
            file,
        })
    }

    fn bad(&self, reason: String) -> InputError {
        InputError::at(
            self.file,
            format!("line {}", self.line),
            format!("<{}>: {reason}", self.element),
        )
    }

    fn opt(&self, key: &str) -> Option<&str> {
        self.pairs
            .iter()
            .find(|(k, _)| *k == key)
            .map(|(_, v)| v.as_ref())
    }

    fn get(&self, key: &str) -> Result<&str> {
        self.opt(key).ok_or_else(|| {
            self.bad(format!(
                "lacks attribute `{key}`, which the executor requires"
            ))
            .into()
        })
    }

    /// A plain decimal integer: `strtol` would read `010` as octal and
    /// `0x10` as hex, and junk as 0 without complaint.
    fn int(&self, key: &str) -> Result<i64> {
        let v = self.get(key)?;
        let digits = v.strip_prefix('-').unwrap_or(v);
        let plain = !digits.is_empty()
            && digits.bytes().all(|b| b.is_ascii_digit())
            && (digits == "0" || !digits.starts_with('0'));
        match v.parse::<i64>() {
            Ok(x) if plain => Ok(x),
            _ => Err(self
                .bad(format!(
                    "{key}=\"{}\" is not a plain decimal number (the executor reads numbers with strtol)",
                    clip(v)
                ))
                .into()),
        }
    }

    fn flag(&self, key: &str) -> Result<bool> {
        match self.get(key)? {
            "0" => Ok(false),
            "1" => Ok(true),
            v => Err(self
                .bad(format!("{key}=\"{}\" must be 0 or 1", clip(v)))
                .into()),
        }
    }
}

/// Byte offset to line number.
struct LineIndex {
    starts: Vec<usize>,
}

impl LineIndex {
    fn new(text: &str) -> Self {
        let mut starts = vec![0];
        starts.extend(text.match_indices('\n').map(|(i, _)| i + 1));
        LineIndex { starts }
    }

    /// The line of the first non-blank byte at or after `pos`.
    fn line_of(&self, text: &str, pos: usize) -> usize {
        let skip = text
            .get(pos..)
            .map_or(0, |t| t.len() - t.trim_start().len());
        let p = pos + skip;
        self.starts.partition_point(|&s| s <= p).max(1)
    }
}

/// Chunks per pair and where they sit: from the file's chunk comments and
/// the layout in its name, else the uniform all-to-all.
pub(crate) fn chunk_map(algo: &Algo, file: &str) -> Result<ChunkMap> {
    let bad = |reason: String| -> crate::error::Error {
        InputError::at(file, format!("line {}", algo.line), reason).into()
    };
    // Bounds first: the map holds ngpus^2 counts, and offsets are int16.
    let n = algo.ngpus;
    if n < 1 || n > MAX_NODES as i64 {
        return Err(bad(format!(
            "ngpus=\"{n}\" must be in 1..={MAX_NODES} (the executor loads at most {MAX_NODES} elements)"
        )));
    }
    if algo.nchunksperloop < 1 || algo.nchunksperloop > MAX_OFFSET + 1 {
        return Err(bad(format!(
            "nchunksperloop=\"{}\" must be in 1..={}",
            algo.nchunksperloop,
            MAX_OFFSET + 1
        )));
    }
    let layout = algo.facts().layout.unwrap_or_default();
    match &algo.chunks {
        Some(rows) => {
            if rows.len() != n as usize || rows.iter().any(|r| r.len() != n as usize) {
                return Err(bad(format!(
                    "the chunk comments must give {n} rows of {n} counts"
                )));
            }
            let m = ChunkMap::new(rows.clone(), layout);
            if m.nchunksperloop as i64 != algo.nchunksperloop {
                return Err(bad(format!(
                    "nchunksperloop=\"{}\" but the chunk comments in {layout} layout need {}",
                    algo.nchunksperloop, m.nchunksperloop
                )));
            }
            Ok(m)
        }
        None => {
            if algo.nchunksperloop < 1 || algo.nchunksperloop % n != 0 {
                return Err(bad(format!(
                    "nchunksperloop=\"{}\" is not a positive multiple of ngpus=\"{n}\": all-to-all blocks would split chunks",
                    algo.nchunksperloop
                )));
            }
            Ok(ChunkMap::uniform(
                n as usize,
                (algo.nchunksperloop / n) as u32,
            ))
        }
    }
}
