//! Traffic matrices: bytes from every rank to every rank, their JSON and CSV
//! forms, and the all-to-all(v) buffer layout they imply.
//!
//! Owns: parsing with precise errors (row, column), writing, totals, and the
//! [`Layout`] (where each block sits in the input and output buffers). Knows
//! nothing of topologies or plans. The generator lives in [`crate::generate`].

use serde::Serialize;

use crate::error::{check_no_bom, clip, read_file, InputError, Result};

/// Most bytes one matrix may carry in total: 2^53 (9 PB), so that every byte
/// count, offset and sum is exact in the f64s the simulator and the LP
/// compute in, and no sum of a matrix's bytes can overflow a u64.
pub const MAX_TOTAL_BYTES: u64 = 1 << 53;

/// `bytes[s * ranks + d]`: bytes rank `s` sends to rank `d`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TrafficMatrix {
    ranks: usize,
    bytes: Vec<u64>,
}

#[derive(Serialize)]
struct TrafficFile<'a> {
    ranks: usize,
    matrix: Vec<&'a [u64]>,
}

impl TrafficMatrix {
    pub fn zeros(ranks: usize) -> Self {
        TrafficMatrix {
            ranks,
            bytes: vec![0; ranks * ranks],
        }
    }

    /// A matrix from its rows; panics if they are not `ranks` rows of `ranks`
    /// values (library callers build these; files go through the parsers).
    pub fn from_rows(rows: Vec<Vec<u64>>) -> Self {
        let n = rows.len();
        assert!(
            rows.iter().all(|r| r.len() == n),
            "traffic rows must form a square"
        );
        TrafficMatrix {
            ranks: n,
            bytes: rows.into_iter().flatten().collect(),
        }
    }

    /// A matrix from `ranks * ranks` byte counts in row-major order, checked
    /// as a file's are: at least one rank, and at most [`MAX_TOTAL_BYTES`] in
    /// all. `source` names the matrix in errors (bindings pass `matrix`).
    pub fn from_row_major(ranks: usize, bytes: Vec<u64>, source: &str) -> Result<Self> {
        if ranks == 0 {
            return Err(InputError::new(source, "is empty").into());
        }
        if ranks.checked_mul(ranks) != Some(bytes.len()) {
            return Err(InputError::new(
                source,
                format!(
                    "has {} values, not {ranks} x {ranks}: it must be square",
                    bytes.len()
                ),
            )
            .into());
        }
        let mut total = Total::default();
        for (k, &b) in bytes.iter().enumerate() {
            total
                .add(b)
                .map_err(|reason| cell(source, k / ranks, k % ranks, reason))?;
        }
        Ok(TrafficMatrix { ranks, bytes })
    }

    /// The same number of bytes between every pair, and on the diagonal.
    pub fn uniform(ranks: usize, bytes: u64) -> Self {
        TrafficMatrix {
            ranks,
            bytes: vec![bytes; ranks * ranks],
        }
    }

    pub fn ranks(&self) -> usize {
        self.ranks
    }
    pub fn get(&self, src: usize, dst: usize) -> u64 {
        self.bytes[src * self.ranks + dst]
    }
    pub fn set(&mut self, src: usize, dst: usize, bytes: u64) {
        self.bytes[src * self.ranks + dst] = bytes;
    }
    pub fn add(&mut self, src: usize, dst: usize, bytes: u64) {
        self.bytes[src * self.ranks + dst] += bytes;
    }
    pub fn row(&self, src: usize) -> &[u64] {
        &self.bytes[src * self.ranks..(src + 1) * self.ranks]
    }
    /// Row-major values.
    pub fn as_slice(&self) -> &[u64] {
        &self.bytes
    }
    pub fn row_sum(&self, src: usize) -> u64 {
        self.row(src).iter().sum()
    }
    pub fn col_sum(&self, dst: usize) -> u64 {
        (0..self.ranks).map(|s| self.get(s, dst)).sum()
    }
    pub fn total(&self) -> u64 {
        self.bytes.iter().sum()
    }
    /// Bytes that leave their rank (the diagonal excluded).
    pub fn off_diagonal_total(&self) -> u64 {
        self.total() - (0..self.ranks).map(|r| self.get(r, r)).sum::<u64>()
    }
    pub fn max_entry(&self) -> u64 {
        self.bytes.iter().copied().max().unwrap_or(0)
    }

    /// A short name of this exact matrix: 16 lowercase hex digits of the
    /// 64-bit FNV-1a hash of the rank count and every entry (little-endian
    /// `u64`s, row-major). A plan records it (`Plan::traffic_fingerprint`,
    /// the `matrix=` fact of an MSCCL file's name) so that it is only used
    /// for the matrix it was made for: two matrices that differ in one byte
    /// of one pair get different fingerprints (up to hash collisions, about
    /// 2^-64 for a pair of matrices).
    pub fn fingerprint(&self) -> String {
        const OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
        const PRIME: u64 = 0x0000_0100_0000_01b3;
        let mut h = OFFSET;
        let words = std::iter::once(self.ranks as u64).chain(self.bytes.iter().copied());
        for w in words {
            for b in w.to_le_bytes() {
                h ^= u64::from(b);
                h = h.wrapping_mul(PRIME);
            }
        }
        format!("{h:016x}")
    }

    /// Whether `s` is what [`TrafficMatrix::fingerprint`] writes.
    pub fn is_fingerprint(s: &str) -> bool {
        s.len() == 16 && s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
    }

    /// Reads a traffic file: JSON (`{"ranks": N, "matrix": [[...]]}` or a
    /// bare list of rows), or delimited text (CSV, TSV, whitespace) when the
    /// name ends in `.csv`, `.tsv` or `.txt`.
    pub fn load(path: &std::path::Path) -> Result<Self> {
        let text = read_file(path)?;
        let file = path.display().to_string();
        let ext = path
            .extension()
            .and_then(|e| e.to_str())
            .map(str::to_ascii_lowercase);
        if matches!(ext.as_deref(), Some("csv" | "tsv" | "txt")) {
            Self::from_csv_str(&text, &file)
        } else {
            Self::from_json_str(&text, &file)
        }
    }

    /// Parses the JSON form, naming the row and column of a bad value. A bare
    /// list of rows (`[[0, 5], [7, 0]]`, what `json.dumps(t.tolist())`
    /// writes) is read as the `matrix` field alone.
    pub fn from_json_str(text: &str, file: &str) -> Result<Self> {
        check_no_bom(text, file)?;
        let value: serde_json::Value =
            serde_json::from_str(text).map_err(|e| crate::error::json_error(file, &e))?;
        let rows = match &value {
            serde_json::Value::Array(rows) => rows,
            serde_json::Value::Object(obj) => {
                let rows = obj
                    .get("matrix")
                    .ok_or_else(|| InputError::new(file, "missing field `matrix`"))?
                    .as_array()
                    .ok_or_else(|| InputError::at(file, "matrix", "must be an array of rows"))?;
                if let Some(r) = obj.get("ranks") {
                    let declared = r.as_u64().ok_or_else(|| {
                        InputError::at(file, "ranks", "must be a non-negative integer")
                    })?;
                    if declared as usize != rows.len() {
                        return Err(InputError::at(
                            file,
                            "ranks",
                            format!("says {declared} but `matrix` has {} rows", rows.len()),
                        )
                        .into());
                    }
                }
                if let Some(k) = obj.keys().find(|k| *k != "ranks" && *k != "matrix") {
                    return Err(InputError::new(
                        file,
                        format!("unknown field `{k}` (expected `ranks`, `matrix`)"),
                    )
                    .into());
                }
                rows
            }
            _ => {
                return Err(InputError::new(
                    file,
                    "expected a JSON object with `ranks` and `matrix`, or a list of rows",
                )
                .into())
            }
        };
        let n = rows.len();
        if n == 0 {
            return Err(InputError::at(file, "matrix", "is empty").into());
        }
        // Every row's shape first: the n x n cells are allocated only once
        // the file is known to hold them all.
        let mut cells: Vec<&[serde_json::Value]> = Vec::with_capacity(n);
        for (i, row) in rows.iter().enumerate() {
            let row = row.as_array().ok_or_else(|| {
                InputError::at(file, format!("row {i}"), "must be an array of byte counts")
            })?;
            cells.push(row);
        }
        check_square(file, cells.iter().map(|r| r.len()), None)?;
        let mut m = TrafficMatrix::zeros(n);
        let mut total = Total::default();
        for (i, row) in cells.iter().enumerate() {
            for (j, v) in row.iter().enumerate() {
                let b = json_bytes(v)
                    .and_then(|b| total.add(b))
                    .map_err(|reason| cell(file, i, j, reason))?;
                m.set(i, j, b);
            }
        }
        Ok(m)
    }

    /// Parses delimited text: one line per source rank, byte counts
    /// separated by commas, tabs or spaces (the first data line decides).
    /// A first line of column names is a header and skipped; when its first
    /// name is empty (`,0,1,2`, as pandas writes), the first column holds
    /// row labels and is skipped too. Lines starting with `#` are comments.
    pub fn from_csv_str(text: &str, file: &str) -> Result<Self> {
        check_no_bom(text, file)?;
        let lines: Vec<(usize, &str)> = text
            .lines()
            .enumerate()
            .map(|(i, l)| (i + 1, l.trim()))
            .filter(|(_, l)| !l.is_empty() && !l.starts_with('#'))
            .collect();
        let Some(&(_, first)) = lines.first() else {
            return Err(InputError::new(file, "is empty").into());
        };
        let sep = Separator::of(first);
        let mut rows: Vec<(usize, Vec<&str>)> =
            lines.iter().map(|&(n, l)| (n, sep.split(l))).collect();
        let header = header_kind(&rows);
        if header != Header::None {
            rows.remove(0);
            if rows.is_empty() {
                return Err(InputError::new(file, "has a header line and no rows").into());
            }
        }
        if header == Header::WithRowLabels {
            for (_, r) in &mut rows {
                if !r.is_empty() {
                    r.remove(0);
                }
            }
        }
        let note =
            (header != Header::None).then_some("line 1 was read as a header of column names");
        // Every row's shape first, as for JSON: allocate n x n cells only
        // once the file is known to hold them.
        check_square(file, rows.iter().map(|(_, r)| r.len()), note)?;
        let n = rows.len();
        let mut m = TrafficMatrix::zeros(n);
        let mut total = Total::default();
        for (i, (_, row)) in rows.iter().enumerate() {
            for (j, c) in row.iter().enumerate() {
                let b = text_bytes(c)
                    .and_then(|b| total.add(b))
                    .map_err(|reason| cell(file, i, j, reason))?;
                m.set(i, j, b);
            }
        }
        Ok(m)
    }

    pub fn to_json(&self) -> String {
        let rows: Vec<&[u64]> = (0..self.ranks).map(|s| self.row(s)).collect();
        // One row per line: readable and diff-friendly for large matrices.
        let mut out = format!("{{\n  \"ranks\": {},\n  \"matrix\": [\n", self.ranks);
        for (i, row) in rows.iter().enumerate() {
            let cells: Vec<String> = row.iter().map(u64::to_string).collect();
            out.push_str("    [");
            out.push_str(&cells.join(", "));
            out.push_str(if i + 1 < rows.len() { "],\n" } else { "]\n" });
        }
        out.push_str("  ]\n}\n");
        debug_assert!(serde_json::to_string(&TrafficFile {
            ranks: self.ranks,
            matrix: rows
        })
        .is_ok());
        out
    }

    pub fn to_csv(&self) -> String {
        self.to_delimited(',')
    }

    /// One line per source rank, byte counts separated by `sep` (`,` for
    /// CSV, `\t` for TSV), no header.
    pub fn to_delimited(&self, sep: char) -> String {
        let mut out = String::new();
        for s in 0..self.ranks {
            for (j, b) in self.row(s).iter().enumerate() {
                if j > 0 {
                    out.push(sep);
                }
                out.push_str(&b.to_string());
            }
            out.push('\n');
        }
        out
    }

    /// Checks that this matrix fits a cluster of `ranks` GPUs.
    pub fn check_ranks(&self, ranks: usize, file: &str) -> Result<()> {
        if self.ranks != ranks {
            return Err(InputError::new(
                file,
                format!(
                    "traffic has {} ranks but the topology has {ranks} GPUs",
                    self.ranks
                ),
            )
            .into());
        }
        Ok(())
    }
}

/// How the cells of a delimited line are separated.
#[derive(Clone, Copy)]
enum Separator {
    Comma,
    Tab,
    Whitespace,
}

impl Separator {
    fn of(line: &str) -> Self {
        if line.contains(',') {
            Separator::Comma
        } else if line.contains('\t') {
            Separator::Tab
        } else {
            Separator::Whitespace
        }
    }

    fn split(self, line: &str) -> Vec<&str> {
        match self {
            Separator::Comma => line.split(',').map(str::trim).collect(),
            Separator::Tab => line.split('\t').map(str::trim).collect(),
            Separator::Whitespace => line.split_whitespace().collect(),
        }
    }
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Header {
    None,
    /// A line of column names.
    Names,
    /// Column names after an empty corner: the rows start with a label.
    WithRowLabels,
}

/// Whether the first line is a header: it has a cell that is no number (a
/// name, or the empty corner above a column of row labels), or it is the
/// column numbers `0, 1, ..., n-1` (or from 1) above `n` rows.
fn header_kind(rows: &[(usize, Vec<&str>)]) -> Header {
    let Some((_, first)) = rows.first() else {
        return Header::None;
    };
    if first.first().is_some_and(|c| c.is_empty()) && first.len() > 1 {
        return Header::WithRowLabels;
    }
    if first.iter().any(|c| c.parse::<f64>().is_err()) {
        return Header::Names;
    }
    let w = first.len();
    let counts = |from: u64| {
        first
            .iter()
            .zip(from..)
            .all(|(c, k)| c.parse::<u64>() == Ok(k))
    };
    if rows.len() == w + 1
        && rows[1..].iter().all(|(_, r)| r.len() == w)
        && (counts(0) || counts(1))
    {
        return Header::Names;
    }
    Header::None
}

/// Checks that rows of these lengths form a non-empty square, with a message
/// that says what shape the file has instead. `note` adds what the reader
/// assumed (a header) when it may explain the shape.
fn check_square(
    file: &str,
    lens: impl ExactSizeIterator<Item = usize> + Clone,
    note: Option<&str>,
) -> Result<()> {
    let n = lens.len();
    let note = note.map_or(String::new(), |s| format!(" ({s})"));
    let mut widths = lens.clone();
    let w0 = widths.next().unwrap_or(0);
    if let Some((i, w)) = lens.clone().enumerate().find(|&(_, w)| w != w0) {
        return Err(InputError::at(
            file,
            format!("row {i}"),
            format!("has {w} values but row 0 has {w0}: rows must be of one length{note}"),
        )
        .into());
    }
    if w0 != n {
        return Err(InputError::new(
            file,
            format!(
                "is not square: {} of {}; a traffic matrix has one row and one column per rank{note}",
                count(n, "row"),
                count(w0, "value")
            ),
        )
        .into());
    }
    Ok(())
}

fn count(n: usize, what: &str) -> String {
    format!("{n} {what}{}", if n == 1 { "" } else { "s" })
}

fn cell(file: &str, row: usize, col: usize, reason: String) -> InputError {
    InputError::at(file, format!("row {row}, column {col}"), reason)
}

/// The running total of a matrix being read, held under [`MAX_TOTAL_BYTES`].
#[derive(Default)]
struct Total(u64);

impl Total {
    fn add(&mut self, b: u64) -> std::result::Result<u64, String> {
        match self.0.checked_add(b).filter(|&t| t <= MAX_TOTAL_BYTES) {
            Some(t) => {
                self.0 = t;
                Ok(b)
            }
            None => Err(format!(
                "{b} bytes bring the matrix's total past 2^53 bytes (9 PB), the most one all-to-all may carry"
            )),
        }
    }
}

fn json_bytes(v: &serde_json::Value) -> std::result::Result<u64, String> {
    match v {
        serde_json::Value::Number(x) => {
            if let Some(b) = x.as_u64() {
                return Ok(b);
            }
            // serde_json keeps integers outside i64/u64 and anything with a
            // fraction or an exponent as f64; `x` prints as the file wrote it
            // only for integers, so name the value by what it is.
            let f = x.as_f64().unwrap_or(f64::NAN);
            float_bytes(&x.to_string(), f)
        }
        other => Err(format!("not a byte count: {}", clip(&other.to_string()))),
    }
}

fn text_bytes(c: &str) -> std::result::Result<u64, String> {
    if let Ok(b) = c.parse::<u64>() {
        return Ok(b);
    }
    match c.parse::<f64>() {
        // `inf` and `NaN` parse as f64 but are not numbers a file means.
        Ok(f) if f.is_finite() => float_bytes(c, f),
        _ => Err(format!("not a byte count: {:?}", clip(c))),
    }
}

/// The byte count a number that is not a plain u64 stands for (a whole
/// float), or why it is none.
fn float_bytes(text: &str, f: f64) -> std::result::Result<u64, String> {
    let text = clip(text);
    if f < 0.0 || (f == 0.0 && text.starts_with('-')) {
        Err(format!("negative byte count {text}"))
    } else if f.fract() != 0.0 {
        Err(format!("fractional byte count {text}: bytes must be whole"))
    } else if f >= u64::MAX as f64 {
        Err(format!(
            "byte count {text} is too large (at most 2^53 bytes in all)"
        ))
    } else if f <= MAX_TOTAL_BYTES as f64 {
        // A whole number written as a float (`3.0`, `1e3`: what
        // `tensor.tolist()` or `numpy.savetxt` write) is exact up to 2^53.
        Ok(f as u64)
    } else {
        Err(format!(
            "byte count {text} is past 2^53 written as a float, where it is not exact; write it as a plain integer"
        ))
    }
}

/// Where every block of an all-to-all(v) sits.
///
/// Input of `s` is the concatenation over destinations `d` (rank order) of
/// `M[s][d]`; output of `d` is the concatenation over sources `s` of `M[s][d]`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Layout {
    ranks: usize,
    /// `send_off[s * n + d]`: offset of block (s, d) in input of `s`.
    send_off: Vec<u64>,
    /// `recv_off[d * n + s]`: offset of block (s, d) in output of `d`.
    recv_off: Vec<u64>,
    input_size: Vec<u64>,
    output_size: Vec<u64>,
}

impl Layout {
    pub fn new(m: &TrafficMatrix) -> Self {
        let n = m.ranks();
        let mut send_off = vec![0; n * n];
        let mut recv_off = vec![0; n * n];
        let mut input_size = vec![0; n];
        let mut output_size = vec![0; n];
        for s in 0..n {
            for d in 0..n {
                let b = m.get(s, d);
                send_off[s * n + d] = input_size[s];
                input_size[s] += b;
                recv_off[d * n + s] = output_size[d];
                output_size[d] += b;
            }
        }
        Layout {
            ranks: n,
            send_off,
            recv_off,
            input_size,
            output_size,
        }
    }
    pub fn ranks(&self) -> usize {
        self.ranks
    }
    /// Offset of block (src, dst) in the input buffer of `src`.
    pub fn send_offset(&self, src: usize, dst: usize) -> u64 {
        self.send_off[src * self.ranks + dst]
    }
    /// Offset of block (src, dst) in the output buffer of `dst`.
    pub fn recv_offset(&self, src: usize, dst: usize) -> u64 {
        self.recv_off[dst * self.ranks + src]
    }
    pub fn input_size(&self, rank: usize) -> u64 {
        self.input_size[rank]
    }
    pub fn output_size(&self, rank: usize) -> u64 {
        self.output_size[rank]
    }
}

#[cfg(test)]
mod tests {

    #[test]
    fn fingerprint_names_the_exact_matrix() {
        let a = TrafficMatrix::uniform(4, 1000);
        let f = a.fingerprint();
        assert!(TrafficMatrix::is_fingerprint(&f), "{f}");
        assert_eq!(f, TrafficMatrix::uniform(4, 1000).fingerprint());
        let mut b = a.clone();
        b.add(3, 2, 1);
        assert_ne!(b.fingerprint(), f, "one byte of one pair");
        let mut c = a.clone();
        c.set(0, 1, 1001);
        c.set(3, 2, 999);
        assert_ne!(c.fingerprint(), f, "same total, moved byte");
        assert_ne!(
            TrafficMatrix::zeros(2).fingerprint(),
            TrafficMatrix::zeros(3).fingerprint()
        );
        assert!(!TrafficMatrix::is_fingerprint("ABCDEF0123456789"));
        assert!(!TrafficMatrix::is_fingerprint("abc"));
    }

    use super::*;

    #[test]
    fn row_major_checked() {
        let m = TrafficMatrix::from_row_major(2, vec![1, 2, 3, 4], "matrix").unwrap();
        assert_eq!(m, TrafficMatrix::from_rows(vec![vec![1, 2], vec![3, 4]]));
        let e = TrafficMatrix::from_row_major(2, vec![1, 2, 3], "matrix").unwrap_err();
        assert!(e.to_string().contains("must be square"), "{e}");
        assert!(TrafficMatrix::from_row_major(0, vec![], "matrix").is_err());
        let e = TrafficMatrix::from_row_major(1, vec![u64::MAX], "matrix").unwrap_err();
        assert_eq!(
            e.to_string().split(": ").take(2).collect::<Vec<_>>(),
            ["matrix", "row 0, column 0"]
        );
    }

    #[test]
    fn json_round_trip() {
        let m = TrafficMatrix::from_rows(vec![vec![1, 2], vec![3, 4]]);
        let back = TrafficMatrix::from_json_str(&m.to_json(), "m").unwrap();
        assert_eq!(m, back);
        let back = TrafficMatrix::from_csv_str(&m.to_csv(), "m.csv").unwrap();
        assert_eq!(m, back);
    }

    #[test]
    fn errors_name_row_and_column() {
        let e = |t: &str| {
            TrafficMatrix::from_json_str(t, "m.json")
                .unwrap_err()
                .to_string()
        };
        assert_eq!(
            e(r#"{"ranks":2,"matrix":[[1,2],[3,-4]]}"#),
            "m.json: row 1, column 1: negative byte count -4"
        );
        assert!(
            e(r#"{"ranks":2,"matrix":[[1,2.5],[3,4]]}"#).contains("row 0, column 1: fractional")
        );
        assert!(e(r#"{"ranks":2,"matrix":[[1,"x"],[3,4]]}"#)
            .contains("row 0, column 1: not a byte count"));
        assert_eq!(
            e(r#"{"ranks":2,"matrix":[[1,2,3],[3,4]]}"#),
            "m.json: row 1: has 2 values but row 0 has 3: rows must be of one length"
        );
        assert!(e(r#"{"ranks":3,"matrix":[[1,2],[3,4]]}"#).contains("ranks: says 3"));
        assert!(e(r#"{"ranks":2,"matrix":[[1,2],[3,4]"#).contains("truncated"));
        let e = TrafficMatrix::from_csv_str("1,2\n3,x\n", "m.csv")
            .unwrap_err()
            .to_string();
        assert_eq!(e, "m.csv: row 1, column 1: not a byte count: \"x\"");
        let e = TrafficMatrix::from_csv_str("1,2\n3,-1\n", "m.csv")
            .unwrap_err()
            .to_string();
        assert!(e.contains("negative"), "{e}");
    }

    #[test]
    fn totals_and_numbers_are_bounded() {
        let e = |t: &str| {
            TrafficMatrix::from_json_str(t, "m.json")
                .unwrap_err()
                .to_string()
        };
        let c = |t: &str| {
            TrafficMatrix::from_csv_str(t, "m.csv")
                .unwrap_err()
                .to_string()
        };
        // Sums of u64::MAX cells overflowed in the layout and every total.
        assert!(e(r#"{"matrix":[[18446744073709551615,1],[0,0]]}"#)
            .starts_with("m.json: row 0, column 0: 18446744073709551615 bytes bring the matrix's total past 2^53"));
        assert!(c("9007199254740992,0\n1,0\n").starts_with("m.csv: row 1, column 0: 1 bytes bring"));
        assert!(TrafficMatrix::from_csv_str("9007199254740992,0\n0,0\n", "m.csv").is_ok());
        // Numbers that are huge or not numbers at all were called "fractional".
        assert!(e(r#"{"matrix":[[1e17,1],[1,1]]}"#).contains("past 2^53 written as a float"));
        assert!(e(r#"{"matrix":[[18446744073709551616,1],[1,1]]}"#).contains("is too large"));
        assert!(c("1,2\n3,18446744073709551616\n")
            .contains("row 1, column 1: byte count 18446744073709551616 is too large"));
        assert_eq!(
            c("1,inf\n3,4\n"),
            "m.csv: row 0, column 1: not a byte count: \"inf\""
        );
        assert!(c("1,NaN\n3,4\n").contains("not a byte count"));
        assert!(c("1,1e17\n3,4\n").contains("write it as a plain integer"));
        assert!(c("1,2.5\n3,4\n").contains("fractional"));
        assert_eq!(
            c("\u{feff}1,2\n3,4\n"),
            "m.csv: line 1: begins with a UTF-8 byte-order mark; save the file without one"
        );
        assert!(e("\u{feff}{\"matrix\":[[1]]}").contains("byte-order mark"));
    }

    #[test]
    fn shape_is_checked_before_cells_are_allocated() {
        // 2 million empty rows asked for 2M x 2M cells (32 TB) before the
        // first row's length was looked at.
        let rows = vec!["[]"; 2_000_000].join(",");
        let e = TrafficMatrix::from_json_str(&format!(r#"{{"matrix":[{rows}]}}"#), "m.json")
            .unwrap_err()
            .to_string();
        assert_eq!(
            e,
            "m.json: is not square: 2000000 rows of 0 values; a traffic matrix has one row and one column per rank"
        );
        let e = TrafficMatrix::from_csv_str(&"0\n".repeat(300_000), "m.csv")
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("m.csv: is not square: 300000 rows of 1 value;"),
            "{e}"
        );
    }

    #[test]
    fn matrices_as_people_write_them() {
        let want = TrafficMatrix::from_rows(vec![vec![0, 5, 3], vec![7, 0, 1], vec![2, 9, 0]]);
        let json = |t: &str| TrafficMatrix::from_json_str(t, "m.json");
        let text = |t: &str| TrafficMatrix::from_csv_str(t, "m.csv");
        // `json.dumps(t.tolist())` of a float tensor: a bare list, whole floats.
        assert_eq!(
            json("[[0.0, 5.0, 3.0], [7.0, 0.0, 1.0], [2.0, 9.0, 0.0]]").unwrap(),
            want
        );
        assert_eq!(json("[[0, 5, 3e0], [7, 0, 1], [2, 9, 0]]").unwrap(), want);
        // A header of names, of column numbers, or pandas' `to_csv()` with
        // its index column.
        assert_eq!(text("a,b,c\n0,5,3\n7,0,1\n2,9,0\n").unwrap(), want);
        assert_eq!(text("0,1,2\n0,5,3\n7,0,1\n2,9,0\n").unwrap(), want);
        assert_eq!(text(",0,1,2\n0,0,5,3\n1,7,0,1\n2,2,9,0\n").unwrap(), want);
        // TSV, `numpy.savetxt` (spaces, exponents, a `#` comment).
        assert_eq!(text("0\t5\t3\n7\t0\t1\n2\t9\t0\n").unwrap(), want);
        let savetxt = "# bytes\n0.000e+00 5.000e+00 3.0e+00\n7.0e+00 0.0e+00 1.0e+00\n2 9 0\n";
        assert_eq!(text(savetxt).unwrap(), want);
        // Round trips through every delimited form.
        assert_eq!(text(&want.to_delimited('\t')).unwrap(), want);
        // Fractions stay errors.
        assert!(json("[[0.5]]")
            .unwrap_err()
            .to_string()
            .contains("fractional"));
    }

    #[test]
    fn shape_errors_say_what_the_shape_is() {
        let text = |t: &str| {
            TrafficMatrix::from_csv_str(t, "m.csv")
                .unwrap_err()
                .to_string()
        };
        assert_eq!(
            text("1,2,3\n4,5,6\n"),
            "m.csv: is not square: 2 rows of 3 values; a traffic matrix has one row and one column per rank"
        );
        // A header over rows that are not square says it was read as one.
        assert_eq!(
            text("src,dst\n1,2\n"),
            "m.csv: is not square: 1 row of 2 values; a traffic matrix has one row and one column per rank (line 1 was read as a header of column names)"
        );
        assert_eq!(text("a,b\n"), "m.csv: has a header line and no rows");
        let e = TrafficMatrix::from_json_str("[[1,2],[3,4],[5,6]]", "m.json")
            .unwrap_err()
            .to_string();
        assert!(e.contains("is not square: 3 rows of 2 values"), "{e}");
        let e = TrafficMatrix::from_json_str("5", "m.json")
            .unwrap_err()
            .to_string();
        assert!(e.contains("or a list of rows"), "{e}");
    }

    #[test]
    fn layout_offsets() {
        let m = TrafficMatrix::from_rows(vec![vec![1, 2, 3], vec![4, 5, 6], vec![7, 8, 9]]);
        let l = Layout::new(&m);
        assert_eq!(l.send_offset(1, 2), 4 + 5);
        assert_eq!(l.recv_offset(2, 1), 2 + 5);
        assert_eq!(l.input_size(2), 24);
        assert_eq!(l.output_size(0), 12);
    }
}
