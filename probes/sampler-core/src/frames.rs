//! Frame interning: each distinct (function, file, line) gets an id and one
//! `F` line in the capture the first time it is seen.

use std::collections::HashMap;
use std::io::Write;

/// One field of a tab-separated line: no tabs, newlines or other control characters
/// (a non-blocking read can catch a frame mid-update and return garbage).
pub fn clean(s: &str) -> String {
    s.chars().map(|c| if c.is_control() { ' ' } else { c }).collect()
}

#[derive(Default)]
pub struct Frames {
    ids: HashMap<(String, String, i32), u64>,
}

impl Frames {
    pub fn id(&mut self, out: &mut impl Write, function: &str, filename: &str, line: i32) -> u64 {
        let key = (function.to_string(), filename.to_string(), line);
        if let Some(&id) = self.ids.get(&key) {
            return id;
        }
        let id = self.ids.len() as u64;
        let _ = writeln!(out, "F\t{id}\t{}\t{}\t{line}", clean(function), clean(filename));
        self.ids.insert(key, id);
        id
    }
}
