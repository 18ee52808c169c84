//! Interned names: the few distinct strings (kinds, key fields, states) of many records or
//! objects, held once.

/// A few distinct strings (kinds, key fields, states) held once and referred to by a small
/// index. Lookups are hashed: a snapshot or a fleet with many distinct values (a crafted
/// payload, say) costs linear time, not quadratic.
#[derive(Debug, Default, Clone)]
pub struct Names {
    names: Vec<Box<str>>,
    index: std::collections::HashMap<Box<str>, u32>,
}

impl Names {
    /// The index of `name`, added if it is new.
    pub fn intern(&mut self, name: &str) -> u32 {
        if let Some(&i) = self.index.get(name) {
            return i;
        }
        // Each name costs dozens of bytes: memory runs out long before 2^32 of them.
        let i = u32::try_from(self.names.len()).expect("fewer than 2^32 distinct names");
        self.names.push(name.into());
        self.index.insert(name.into(), i);
        i
    }

    /// The index of `name`, if it was interned.
    pub fn find(&self, name: &str) -> Option<u32> {
        self.index.get(name).copied()
    }

    /// The name at `i`, an index [`Names::intern`] returned.
    pub fn get(&self, i: u32) -> &str {
        &self.names[i as usize]
    }
}

#[cfg(test)]
mod tests {
    use super::Names;

    #[test]
    fn names_are_held_once_and_never_share_an_index() {
        let mut names = Names::default();
        assert_eq!((names.intern("Server"), names.intern("BMC"), names.intern("Server")), (0, 1, 0));
        assert_eq!((names.get(0), names.get(1)), ("Server", "BMC"));
        assert_eq!((names.find("BMC"), names.find("Endpoint")), (Some(1), None));
        // Past what a u16 holds (the index once wrapped there), every name keeps its own index.
        for i in 0..70_000u32 {
            assert_eq!(names.intern(&format!("state-{i}")), i + 2);
        }
        assert_eq!(names.get(65_538), "state-65536");
        assert_eq!(names.intern("Server"), 0);
    }
}
