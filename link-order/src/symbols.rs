//! The binary's functions, from its ELF symbol table, by address.

use std::path::Path;

use object::{Object, ObjectSegment, ObjectSymbol, SymbolKind};

use crate::LinkOrderError;

/// Every sized function symbol of a binary, sorted by address.
pub struct FunctionTable {
    /// `(start, end, name)` with `start` a link-time virtual address.
    functions: Vec<(u64, u64, String)>,
    /// The lowest virtual address of the image (0 for a position-independent binary).
    image_base: u64,
}

impl FunctionTable {
    /// Reads the symbol table of `binary`.
    pub fn load(binary: &Path) -> Result<Self, LinkOrderError> {
        let data = std::fs::read(binary).map_err(|source| LinkOrderError::ReadBinary {
            path: binary.to_owned(),
            source,
        })?;
        let parse_error = |reason: String| LinkOrderError::ParseBinary {
            path: binary.to_owned(),
            reason,
        };
        let file = object::File::parse(&*data).map_err(|error| parse_error(error.to_string()))?;
        let mut functions: Vec<(u64, u64, String)> = file
            .symbols()
            .filter(|symbol| {
                symbol.kind() == SymbolKind::Text && symbol.is_definition() && symbol.size() > 0
            })
            .filter_map(|symbol| {
                let name = std::str::from_utf8(symbol.name_bytes().ok()?).ok()?;
                Some((
                    symbol.address(),
                    symbol.address() + symbol.size(),
                    name.to_owned(),
                ))
            })
            .collect();
        if functions.is_empty() {
            return Err(parse_error("no function symbols".to_owned()));
        }
        // Aliases share an address; the linker orders by any of them, so keep one.
        functions.sort();
        functions.dedup_by_key(|function| function.0);
        // The lowest loaded address, page-aligned as the kernel maps it: 0 for a
        // position-independent binary, 0x400000 or so for a fixed one.
        let image_base = file
            .segments()
            .map(|segment| segment.address())
            .min()
            .ok_or_else(|| parse_error("no loadable segments".to_owned()))?
            & !0xfff;
        Ok(Self {
            functions,
            image_base,
        })
    }

    /// The lowest virtual address the binary is linked at.
    pub fn image_base(&self) -> u64 {
        self.image_base
    }

    /// The index of the function holding the link-time address `address`.
    pub fn function_at(&self, address: u64) -> Option<usize> {
        let index = self
            .functions
            .partition_point(|function| function.0 <= address)
            .checked_sub(1)?;
        (address < self.functions[index].1).then_some(index)
    }

    /// How many functions the table holds.
    pub fn len(&self) -> usize {
        self.functions.len()
    }

    /// The symbol name of function `index`.
    pub fn name(&self, index: usize) -> &str {
        &self.functions[index].2
    }

    /// The symbol names of every function.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.functions.iter().map(|function| function.2.as_str())
    }
}
