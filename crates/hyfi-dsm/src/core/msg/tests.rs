//! The messages' round trips and every malformed input's error.
use super::*;
use crate::elem;

/// A reply holding `gps`, each page's bytes appended by `copy`.
fn pages_frame(gps: &[u64], mut copy: impl FnMut(u64, &mut Vec<u8>)) -> Vec<u8> {
    let mut f = PagesFrame::new(gps.len());
    for &gp in gps {
        f.push(gp, |out| copy(gp, out));
    }
    f.finish()
}

fn encoded(m: impl Encode) -> Vec<u8> {
    // Encoding appends: what the buffer held stays.
    let mut out = vec![0xee; 3];
    let len = m.encoded_len();
    m.encode(&mut out);
    assert_eq!(&out[..3], &[0xee; 3]);
    assert_eq!(out.len() - 3, len, "encoded_len is exact");
    out.drain(..3);
    out
}

fn truncated(at: usize) -> ProtocolError {
    ProtocolError::Truncated { at }
}

/// A page whose bytes are `seed`, `seed + 1`, ... (wrapping).
fn page(seed: u8) -> Vec<u8> {
    (0..PAGE).map(|i| seed.wrapping_add(i as u8)).collect()
}

#[test]
fn kinds_and_their_errors() {
    let req = encoded(Request {
        epoch: 1,
        pages: [2u64].into_iter(),
    });
    assert_eq!(Kind::of(&req), Ok(Kind::Request));
    assert_eq!(Kind::of(&[PAGES]), Ok(Kind::Pages));
    assert_eq!(Kind::of(&[REL]), Ok(Kind::Release));
    assert_eq!(
        Kind::of(&[9, 1]),
        Err(ProtocolError::UnknownKind { kind: 9 })
    );
    assert_eq!(Kind::of(&[]), Err(ProtocolError::Empty));
    // A decoder given another kind's message.
    assert_eq!(
        Pages::decode(&req).map(|_| ()),
        Err(ProtocolError::UnknownKind { kind: REQ })
    );
    assert_eq!(Release::decode(&[]).map(|_| ()), Err(ProtocolError::Empty));
}

#[test]
fn requests_round_trip() {
    let pages = [3u64, 7, 1 << 40];
    let m = encoded(Request {
        epoch: 42,
        pages: pages.iter().copied(),
    });
    assert_eq!(m.len(), 1 + 12 + 8 * 3);
    let r = Request::decode(&m).unwrap();
    assert_eq!(r.epoch, 42);
    assert_eq!(r.pages.len(), 3);
    assert_eq!(r.pages.collect::<Vec<_>>(), pages);
    let none = encoded(Request {
        epoch: 0,
        pages: std::iter::empty(),
    });
    assert_eq!(Request::decode(&none).unwrap().pages.len(), 0);
}

#[test]
fn requests_cut_short_say_where() {
    let m = encoded(Request {
        epoch: 5,
        pages: [1u64, 2].into_iter(),
    });
    let cut = |n: usize| Request::decode(&m[..n]).map(|_| ()).unwrap_err();
    assert_eq!(cut(3), truncated(0)); // in the epoch
    assert_eq!(cut(1 + 10), truncated(8)); // in the count
    assert_eq!(cut(1 + 12 + 3), truncated(12)); // in the first page
    assert_eq!(cut(1 + 12 + 8 + 7), truncated(20)); // in the second
}

#[test]
fn replies_round_trip_without_copying_pages() {
    let gps = [9u64, 4];
    let m = pages_frame(&gps, |gp, out| out.extend_from_slice(&page(gp as u8)));
    let p = Pages::decode(&m).unwrap();
    let got: Vec<(u64, &[u8])> = p.iter().collect();
    assert_eq!(got.len(), 2);
    for (&(gp, bytes), &want) in got.iter().zip(&gps) {
        assert_eq!(gp, want);
        assert_eq!(bytes, page(want as u8));
        // Borrowed from the frame.
        assert!(m.as_ptr_range().contains(&bytes.as_ptr()));
    }
}

#[test]
fn a_reply_with_fewer_pages_than_its_room_closes_up() {
    // The server makes room for every page asked and skips the ones a
    // plain-store view holds: the frame must read as if built for fewer.
    for (room, gps) in [
        (3usize, vec![7u64]),
        (4, vec![5, 6]),
        (2, vec![]),
        (2, vec![8, 9]),
    ] {
        let mut f = PagesFrame::new(room);
        for &gp in &gps {
            f.push(gp, |out| out.extend_from_slice(&page(gp as u8)));
        }
        let m = f.finish();
        assert_eq!(
            m,
            pages_frame(&gps, |gp, out| out.extend_from_slice(&page(gp as u8)))
        );
        assert_eq!(m.len(), 1 + 4 + gps.len() * (8 + PAGE));
        let p = Pages::decode(&m).unwrap();
        let got: Vec<(u64, &[u8])> = p.iter().collect();
        assert_eq!(got.len(), gps.len());
        for ((gp, bytes), &want) in got.into_iter().zip(&gps) {
            assert_eq!((gp, bytes), (want, &page(want as u8)[..]));
        }
    }
}

#[test]
fn replies_cut_short_say_where() {
    let m = pages_frame(&[1, 2], |_, out| out.extend_from_slice(&page(0)));
    let cut = |n: usize| Pages::decode(&m[..n]).map(|_| ()).unwrap_err();
    assert_eq!(cut(1 + 2), truncated(0));
    assert_eq!(cut(1 + 4 + 12), truncated(12));
    // In the first page's bytes, then in the second's.
    assert_eq!(cut(1 + 20 + 100), truncated(20));
    assert_eq!(cut(1 + 20 + PAGE + 1), truncated(20 + PAGE));
    assert!(Pages::decode(&m).is_ok());
}

#[test]
#[should_panic(expected = "is one page")]
fn a_reply_page_of_the_wrong_length_is_a_bug() {
    pages_frame(&[1], |_, out| out.push(0));
}

/// A diff's page and runs (offset, bytes), copied out.
type OwnedDiff = (u64, Vec<(usize, Vec<u8>)>);

/// A release to one node: two diffs (one of them empty, dropped), two
/// pushes, a decline; three notice ranges.
fn release() -> (Vec<u8>, Vec<OwnedDiff>) {
    let mut b = ReleaseBody::default();
    let mut want = Vec::new();
    // The diff of a page against its twin.
    let mut words = vec![0u64; PAGE / 8];
    // SAFETY: a page-sized, 8-aligned buffer.
    let twin = unsafe { elem::twin(words.as_ptr() as *const u8) };
    words[3] = 0xff00;
    words[511] = 1;
    let ptr = words.as_ptr() as *const u8;
    // SAFETY: as above.
    let kept = b.diff(70, |out| unsafe {
        super::super::diff::encode(ptr, &twin, out, 1)
    });
    assert_eq!(kept, Some(4 + 1 + 4 + 1));
    want.push((70, vec![(3 * 8 + 1, vec![0xff]), (511 * 8, vec![1])]));
    assert_eq!(b.diff(71, |_| 0), None);
    b.diff(72, |out| {
        out.extend_from_slice(&[10, 0, 2, 0, 0xab, 0xcd]);
        1
    });
    want.push((72, vec![(10, vec![0xab, 0xcd])]));
    b.push(5, |out| out.extend_from_slice(&page(5)));
    b.push(6, |out| out.extend_from_slice(&page(6)));
    assert_eq!(b.pushes(), 2);
    // A push of the home's own writes, as a diff: one run of 3 bytes at 40.
    b.push_diff(7, 1, &[40, 0, 3, 0, 1, 2, 3]);
    assert_eq!(b.pushes(), 3);
    b.decline(8);
    let notices = [(100u64, 3u32), (200, 1), (1 << 33, u32::MAX)];
    let m = encoded(ReleaseOut {
        epoch: 17,
        notices: &notices,
        body: &b,
        carried: &[1, 2, 3, 4, 5],
    });
    (m, want)
}

#[test]
fn releases_round_trip() {
    let (m, want) = release();
    assert_eq!(Release::peek_epoch(&m), Ok(17));
    let r = Release::decode(&m).unwrap();
    assert_eq!(r.epoch, 17);
    assert_eq!(
        r.notices().collect::<Vec<_>>(),
        [(100, 3), (200, 1), (1 << 33, u32::MAX)]
    );
    let diffs: Vec<OwnedDiff> = r
        .diffs()
        .map(|d| (d.page, d.runs().map(|(o, b)| (o, b.to_vec())).collect()))
        .collect();
    assert_eq!(diffs, want);
    assert_eq!(r.diffs().len(), 2);
    let pushes: Vec<(u64, &[u8])> = r.pushes().collect();
    assert_eq!(pushes.len(), 2);
    assert_eq!((pushes[0].0, pushes[0].1), (5, &page(5)[..]));
    assert_eq!((pushes[1].0, pushes[1].1), (6, &page(6)[..]));
    assert!(m.as_ptr_range().contains(&pushes[1].1.as_ptr()));
    let push_diffs: Vec<OwnedDiff> = r
        .push_diffs()
        .map(|d| (d.page, d.runs().map(|(o, b)| (o, b.to_vec())).collect()))
        .collect();
    assert_eq!(push_diffs, [(7, vec![(40, vec![1, 2, 3])])]);
    assert_eq!(r.declines().collect::<Vec<_>>(), [8]);
    assert_eq!(r.carried, [1, 2, 3, 4, 5]);

    // An empty release: the epoch and six zero counts.
    let e = encoded(ReleaseOut {
        epoch: 0,
        notices: &[],
        body: &ReleaseBody::default(),
        carried: &[],
    });
    assert_eq!(e.len(), 1 + 8 + 24);
    let r = Release::decode(&e).unwrap();
    assert_eq!(
        (
            r.notices().len(),
            r.diffs().len(),
            r.pushes().len(),
            r.push_diffs().len(),
            r.declines().len(),
            r.carried.len()
        ),
        (0, 0, 0, 0, 0, 0)
    );
}

/// Every cut of a release is an error: `Truncated`, or, inside a
/// diff's runs, `MalformedDiff`; and the reader's offsets are the
/// field's first byte.
#[test]
fn releases_cut_short_say_where() {
    let (m, _) = release();
    for n in 0..m.len() {
        let e = Release::decode(&m[..n]).map(|_| ()).unwrap_err();
        assert!(
            matches!(
                e,
                ProtocolError::Truncated { .. }
                    | ProtocolError::MalformedDiff { .. }
                    | ProtocolError::Empty
            ),
            "cut at {n}: {e:?}"
        );
    }
    let cut = |n: usize| Release::decode(&m[..n]).map(|_| ()).unwrap_err();
    assert_eq!(Release::peek_epoch(&m[..5]), Err(truncated(0)));
    assert_eq!(cut(1 + 8 + 2), truncated(8));
    // In the second notice's page count.
    assert_eq!(cut(1 + 12 + 12 + 8 + 1), truncated(12 + 12 + 8));
    // In the first diff's runs.
    let diffs = 12 + 3 * NOTICE + 4;
    assert_eq!(
        cut(1 + diffs + 12 + 3),
        ProtocolError::MalformedDiff { page: 70 }
    );
    // In a push's bytes: at the bytes, after its page.
    let pushes = diffs + (12 + 10) + (12 + 6) + 4;
    assert_eq!(cut(1 + pushes + 8 + 10), truncated(pushes + 8));
    // In the pushed diff's runs.
    let push_diffs = pushes + 2 * (8 + PAGE) + 4;
    assert_eq!(
        cut(1 + push_diffs + 12 + 5),
        ProtocolError::MalformedDiff { page: 7 }
    );
    // In the carried bytes: at the bytes, after their length.
    let carried = push_diffs + (12 + 7) + 4 + 8;
    assert_eq!(cut(1 + carried + 4 + 2), truncated(carried + 4));
}

#[test]
fn releases_with_stray_bytes_or_a_bad_diff_are_refused() {
    let (mut m, _) = release();
    m.extend_from_slice(&[0; 5]);
    assert_eq!(
        Release::decode(&m).map(|_| ()),
        Err(ProtocolError::StrayBytes { len: 5 })
    );
    let mut b = ReleaseBody::default();
    // A run that ends past the page.
    b.diff(33, |out| {
        out.extend_from_slice(&(PAGE as u16 - 1).to_le_bytes());
        out.extend_from_slice(&[2, 0, 1, 2]);
        1
    });
    let m = encoded(ReleaseOut {
        epoch: 1,
        notices: &[],
        body: &b,
        carried: &[],
    });
    assert_eq!(
        Release::decode(&m).map(|_| ()),
        Err(ProtocolError::MalformedDiff { page: 33 })
    );
}
