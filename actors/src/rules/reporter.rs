//! Which node writes a domain's status: the live member with the smallest name. Every
//! member computes the same answer from the same view, so there is no election round;
//! when the reporter dies, the next smallest takes over as soon as it is declared dead.

use std::collections::BTreeMap;

pub fn reporter<V>(members: &BTreeMap<String, V>) -> Option<&str> {
    members.keys().next().map(String::as_str)
}

pub fn is_reporter<V>(members: &BTreeMap<String, V>, node: &str) -> bool {
    reporter(members) == Some(node)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn smallest_name_reports_and_the_next_takes_over() {
        let mut members: BTreeMap<String, ()> = ["node-10", "node-02", "node-07"]
            .iter()
            .map(|n| ((*n).to_owned(), ()))
            .collect();
        assert_eq!(reporter(&members), Some("node-02"));
        members.remove("node-02");
        assert!(is_reporter(&members, "node-07"));
        members.clear();
        assert_eq!(reporter(&members), None);
    }
}
