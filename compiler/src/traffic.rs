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

    /// Reads a traffic file: JSON (`{"ranks": N, "matrix": [[...]]}`), or CSV
    /// when the name ends in `.csv`.
    pub fn load(path: &std::path::Path) -> Result<Self> {
        let text = read_file(path)?;
        let file = path.display().to_string();
        if path
            .extension()
            .is_some_and(|e| e.eq_ignore_ascii_case("csv"))
        {
            Self::from_csv_str(&text, &file)
        } else {
            Self::from_json_str(&text, &file)
        }
    }

    /// Parses the JSON form, naming the row and column of a bad value.
    pub fn from_json_str(text: &str, file: &str) -> Result<Self> {
        check_no_bom(text, file)?;
        let value: serde_json::Value =
            serde_json::from_str(text).map_err(|e| crate::error::json_error(file, &e))?;
        let obj = value.as_object().ok_or_else(|| {
            InputError::new(file, "expected a JSON object with `ranks` and `matrix`")
        })?;
        let rows = obj
            .get("matrix")
            .ok_or_else(|| InputError::new(file, "missing field `matrix`"))?
            .as_array()
            .ok_or_else(|| InputError::at(file, "matrix", "must be an array of rows"))?;
        let n = rows.len();
        if let Some(r) = obj.get("ranks") {
            let declared = r
                .as_u64()
                .ok_or_else(|| InputError::at(file, "ranks", "must be a non-negative integer"))?;
            if declared as usize != n {
                return Err(InputError::at(
                    file,
                    "ranks",
                    format!("says {declared} but `matrix` has {n} rows"),
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
            if row.len() != n {
                return Err(InputError::at(
                    file,
                    format!("row {i}"),
                    format!(
                        "has {} values but the matrix has {n} rows: it must be square",
                        row.len()
                    ),
                )
                .into());
            }
            cells.push(row);
        }
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

    /// Parses CSV: one line per source rank, comma-separated byte counts.
    pub fn from_csv_str(text: &str, file: &str) -> Result<Self> {
        check_no_bom(text, file)?;
        let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
        let n = lines.len();
        if n == 0 {
            return Err(InputError::new(file, "is empty").into());
        }
        // Every row's shape first, as for JSON: allocate n x n cells only
        // once the file is known to hold them.
        for (i, line) in lines.iter().enumerate() {
            let count = line.split(',').count();
            if count != n {
                return Err(InputError::at(
                    file,
                    format!("row {i}"),
                    format!("has {count} values but the file has {n} rows: it must be square"),
                )
                .into());
            }
        }
        let mut m = TrafficMatrix::zeros(n);
        let mut total = Total::default();
        for (i, line) in lines.iter().enumerate() {
            for (j, c) in line.split(',').map(str::trim).enumerate() {
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
        let mut out = String::new();
        for s in 0..self.ranks {
            let cells: Vec<String> = self.row(s).iter().map(u64::to_string).collect();
            out.push_str(&cells.join(","));
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
            number_error(&x.to_string(), f)
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
        Ok(f) if f.is_finite() => number_error(c, f),
        _ => Err(format!("not a byte count: {:?}", clip(c))),
    }
}

/// Why a number that is not a u64 is no byte count.
fn number_error(text: &str, f: f64) -> std::result::Result<u64, String> {
    let text = clip(text);
    if f < 0.0 || (f == 0.0 && text.starts_with('-')) {
        Err(format!("negative byte count {text}"))
    } else if f.fract() != 0.0 {
        Err(format!("fractional byte count {text}: bytes must be whole"))
    } else if f >= u64::MAX as f64 {
        Err(format!(
            "byte count {text} is too large (at most 2^53 bytes in all)"
        ))
    } else {
        Err(format!(
            "byte count {text} must be written as a plain integer (no fraction or exponent)"
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
        assert!(e(r#"{"ranks":2,"matrix":[[1,2,3],[3,4]]}"#).contains("row 0: has 3 values"));
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
        // Numbers that are whole, huge or not numbers at all were called "fractional".
        assert_eq!(
            e(r#"{"matrix":[[1e3,1],[1,1]]}"#),
            "m.json: row 0, column 0: byte count 1000.0 must be written as a plain integer (no fraction or exponent)"
        );
        assert!(e(r#"{"matrix":[[18446744073709551616,1],[1,1]]}"#).contains("is too large"));
        assert!(c("1,2\n3,18446744073709551616\n")
            .contains("row 1, column 1: byte count 18446744073709551616 is too large"));
        assert_eq!(
            c("1,inf\n3,4\n"),
            "m.csv: row 0, column 1: not a byte count: \"inf\""
        );
        assert!(c("1,NaN\n3,4\n").contains("not a byte count"));
        assert!(c("1,1e3\n3,4\n").contains("plain integer"));
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
            "m.json: row 0: has 0 values but the matrix has 2000000 rows: it must be square"
        );
        let e = TrafficMatrix::from_csv_str(&"0\n".repeat(300_000), "m.csv")
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("m.csv: row 0: has 1 values but the file has 300000 rows"),
            "{e}"
        );
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
