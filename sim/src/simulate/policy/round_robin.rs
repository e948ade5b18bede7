//! Round robin, per entry node: each entry node cycles over the engines from its own offset
//! (a decentralized router has no shared counter).

pub fn pick(counter: &mut u64, nodes: usize) -> usize {
    let target = (*counter % nodes as u64) as usize;
    *counter += 1;
    target
}

#[cfg(test)]
mod tests {
    #[test]
    fn cycles() {
        let mut c = 2;
        let picks: Vec<_> = (0..4).map(|_| super::pick(&mut c, 3)).collect();
        assert_eq!(picks, vec![2, 0, 1, 2]);
    }
}
