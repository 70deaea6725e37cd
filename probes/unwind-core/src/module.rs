//! One ELF file as the unwinder needs it: its unwind sections for framehop, its load
//! bias in a process, and its symbols. The file's bytes are let go once these are taken.

use framehop::ExplicitModuleSectionInfo;
use object::{Object, ObjectSection, ObjectSegment, ObjectSymbol, SegmentFlags, SymbolKind};

use crate::maps::Mapping;
use crate::open::{read_mapped, Skip};

pub struct Elf {
    symbols: Vec<(u64, u64, String)>, // (svma, size, demangled name), by svma
    /// the executable load segments: (address, file offset, file size)
    segments: Vec<(u64, u64, u64)>,
    sections: ExplicitModuleSectionInfo<Vec<u8>>,
}

impl Elf {
    /// The file a mapping names, read if it passes open.rs's checks.
    pub fn open(m: &Mapping) -> Result<Elf, Skip> {
        let data = read_mapped(m)?;
        let file = object::File::parse(&*data).map_err(|_| Skip::NotElf)?;
        let mut symbols: Vec<(u64, u64, String)> = file
            .symbols()
            .chain(file.dynamic_symbols())
            .filter(|s| s.kind() == SymbolKind::Text && s.address() != 0)
            .filter_map(|s| Some((s.address(), s.size(), demangle(s.name().ok()?))))
            .collect();
        symbols.sort_by_key(|s| (s.0, std::cmp::Reverse(s.1)));
        symbols.dedup_by_key(|s| s.0);
        let segments = file.segments()
            .filter(|seg| matches!(seg.flags(), SegmentFlags::Elf { p_flags, .. } if p_flags.0 & object::elf::PF_X.0 != 0))
            .map(|seg| (seg.address(), seg.file_range().0, seg.file_range().1))
            .collect();
        Ok(Elf { symbols, segments, sections: sections(&file) })
    }

    /// The process's address of the file's address 0, from an executable mapping of it: the
    /// executable load segment whose pages hold the mapping's file offset says which file
    /// address that offset has (a segment may start mid-page, after the previous one's end).
    pub fn bias(&self, m: &Mapping) -> Option<u64> {
        self.segments.iter().find_map(|&(address, off, size)| {
            (off & !0xfff <= m.offset && m.offset < off + size)
                .then(|| m.start.wrapping_sub(address.wrapping_add(m.offset).wrapping_sub(off)))
        })
    }

    pub fn sections(&self) -> ExplicitModuleSectionInfo<Vec<u8>> {
        let s = &self.sections;
        ExplicitModuleSectionInfo {
            base_svma: 0,
            text_svma: s.text_svma.clone(),
            text: s.text.clone(),
            got_svma: s.got_svma.clone(),
            eh_frame_svma: s.eh_frame_svma.clone(),
            eh_frame: s.eh_frame.clone(),
            eh_frame_hdr_svma: s.eh_frame_hdr_svma.clone(),
            eh_frame_hdr: s.eh_frame_hdr.clone(),
            debug_frame: s.debug_frame.clone(),
            ..Default::default()
        }
    }

    /// The function holding a file address; a symbol without a size holds up to the next one.
    pub fn symbol(&self, svma: u64) -> Option<&str> {
        let i = self.symbols.partition_point(|s| s.0 <= svma).checked_sub(1)?;
        let (start, size, name) = &self.symbols[i];
        (*size == 0 || svma < start + size).then_some(name.as_str())
    }
}

fn sections(file: &object::File) -> ExplicitModuleSectionInfo<Vec<u8>> {
    let range = |name: &str| file.section_by_name(name).map(|s| s.address()..s.address() + s.size());
    let data = |name: &str| file.section_by_name(name).and_then(|s| s.data().ok()).map(<[u8]>::to_vec);
    ExplicitModuleSectionInfo {
        base_svma: 0,
        text_svma: range(".text"),
        text: data(".text"),
        got_svma: range(".got"),
        eh_frame_svma: range(".eh_frame"),
        eh_frame: data(".eh_frame"),
        eh_frame_hdr_svma: range(".eh_frame_hdr"),
        eh_frame_hdr: data(".eh_frame_hdr"),
        debug_frame: data(".debug_frame"),
        ..Default::default()
    }
}

fn demangle(name: &str) -> String {
    if let Ok(d) = rustc_demangle::try_demangle(name) {
        return format!("{d:#}"); // without the hash suffix
    }
    if name.starts_with("_Z") {
        if let Some(d) = cpp_demangle::Symbol::new(name.as_bytes()).ok().and_then(|s| s.demangle().ok()) {
            return d;
        }
    }
    name.to_string()
}
