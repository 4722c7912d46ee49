//! The DSM on one node: the API's behaviour and errors (the protocol across
//! nodes is tested with real processes in the workspace's `tests/dsm.rs`).

use bytemuck::{Pod, Zeroable};
use hyfi_core::layer::RuntimeExt;
use hyfi_core::{Config, Control, PoolArray, Program, Runtime};
use hyfi_dsm::{Dsm, DsmError, Placement, PAGE};

fn rt(procs: usize) -> Runtime {
    Runtime::new(Config::new().procs(procs).pin(false)).expect("runtime")
}

#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Pod, Zeroable)]
struct Particle {
    pos: [f32; 3],
    id: u32,
}

#[test]
fn one_dsm_per_runtime_and_arrays_of_every_kind() {
    let rt = rt(2);
    let dsm = Dsm::new(&rt).unwrap();
    let again = Dsm::new(&rt).unwrap();
    assert_eq!((dsm.node(), dsm.nodes()), (0, 1));
    let n = 3000;
    let bytes = dsm.vec::<u8>(n).from_fn(|i| (i % 251) as u8).unwrap();
    let parts = again
        .vec::<Particle>(n)
        .placement(Placement::Cyclic)
        .from_fn(|i| Particle {
            pos: [i as f32, 0.5, -1.0],
            id: i as u32,
        })
        .unwrap();
    let m = dsm
        .matrix::<f64>(40, 37)
        .pad_rows()
        .from_fn(|i, j| (i * 100 + j) as f64)
        .unwrap();
    assert_eq!(m.stride(), PAGE / 8, "a padded row fills a page");
    let mut prog = Program::new();
    prog.phase(
        PoolArray::block(&rt, 0..n, 3),
        |ctx, i| {
            let p = parts.get(i);
            parts.set(
                i,
                Particle {
                    pos: [p.pos[0] * 2.0, p.pos[1], p.pos[2]],
                    id: p.id + 1,
                },
            );
            bytes.set(i, bytes.get(i).wrapping_add(1));
            if i < 40 {
                let row = m.row_mut(ctx, i);
                for j in 0..row.len() {
                    row.set(j, row.get(j) + 0.25);
                }
            }
        },
        |_| Control::Done,
    );
    rt.start(&mut prog).unwrap();
    drop(prog);
    for i in 0..n {
        assert_eq!(bytes.get(i), (i % 251) as u8 + 1);
        assert_eq!(
            parts.get(i),
            Particle {
                pos: [2.0 * i as f32, 0.5, -1.0],
                id: i as u32 + 1
            }
        );
    }
    let all = m.to_vec();
    assert_eq!(all.len(), 40 * 37);
    assert_eq!(all[5 * 37 + 6], 506.25);
    let mut row = vec![0.0; 37];
    m.read_row(39, &mut row);
    assert_eq!(row[36], 3936.25);
    m.write_row(39, &vec![1.0; 37]);
    assert_eq!(m.get(39, 20), 1.0);
    // One node: nothing moved, every phase counted.
    let st = dsm.stats();
    assert_eq!(st.total.pages_fetched + st.total.diffs_sent, 0);
    assert_eq!(st.releases, 1);
}

#[test]
fn views_see_what_filaments_wrote_in_earlier_phases() {
    let rt = rt(2);
    let dsm = Dsm::new(&rt).unwrap();
    let n = 2 * PAGE; // 4 pages of u32
    let v = dsm.vec::<u32>(n).zeroed().unwrap();
    let sums = rt.reduction(0u64);
    let mut prog = Program::new();
    prog.phase(
        PoolArray::block(&rt, 0..n / 64, 2),
        |ctx, b| {
            let w = v.slice_mut(ctx, b * 64..(b + 1) * 64);
            for k in 0..64 {
                w.set(k, (b * 64 + k) as u32);
            }
        },
        |_| Control::Continue,
    );
    prog.phase(
        PoolArray::block(&rt, 0..n / 64, 2),
        |ctx, b| {
            // A view across a page boundary, of the other end of the vector.
            let lo = (n - (b + 1) * 64).saturating_sub(10);
            let r = v.slice(ctx, lo..lo + 64);
            let s: u64 = r.iter().map(u64::from).sum();
            assert_eq!(r.to_vec()[0], lo as u32);
            sums.update(ctx, |t| t + s);
        },
        |post| {
            let _ = post.reduce(&sums, hyfi_core::Op::Sum);
            Control::Done
        },
    );
    rt.start(&mut prog).unwrap();
    drop(prog);
    let want: u64 = (0..n / 64)
        .map(|b| {
            let lo = (n - (b + 1) * 64).saturating_sub(10);
            (lo..lo + 64).map(|x| x as u64).sum::<u64>()
        })
        .sum();
    assert_eq!(rt.get(&sums).unwrap(), want);
    assert_eq!(v.to_vec(), (0..n as u32).collect::<Vec<_>>());
}

#[test]
fn bad_allocations_are_errors_that_say_why() {
    let rt = rt(1);
    let dsm = Dsm::new(&rt).unwrap();
    let e = dsm
        .vec::<u8>(10)
        .placement(Placement::Node(1))
        .zeroed()
        .err()
        .unwrap();
    assert!(
        matches!(e, DsmError::Placement(_))
            && e.to_string()
                .contains("names node 1, but the job has 1 nodes"),
        "{e}"
    );
    let e = dsm
        .vec::<u8>(3 * PAGE)
        .placement(Placement::Explicit(vec![0, 0]))
        .zeroed()
        .err()
        .unwrap();
    assert!(
        e.to_string().contains("2 entries for an array of 3 pages"),
        "{e}"
    );
    // `?` in main prints Debug: it is the message, not the variant's fields.
    assert_eq!(format!("{e:?}"), e.to_string());
    let boxed: Box<dyn std::error::Error> = Box::new(e);
    assert!(format!("{boxed:?}").contains("2 entries for an array of 3 pages"));
    let e = dsm.vec::<[u64; 1024]>(2).zeroed().err().unwrap();
    assert!(e.to_string().contains("must be at most one page"), "{e}");
    // After refused allocations the next one still works.
    let ok = dsm.vec::<u16>(5).from_fn(|i| i as u16 * 3).unwrap();
    assert_eq!(ok.to_vec(), vec![0, 3, 6, 9, 12]);
}

#[test]
#[should_panic(
    expected = "hyfi-dsm: matrix index (3, 0) out of bounds for a shared array of 3 × 4"
)]
fn out_of_bounds_names_the_index_and_the_shape() {
    let rt = rt(1);
    let dsm = Dsm::new(&rt).unwrap();
    let m = dsm.matrix::<f32>(3, 4).zeroed().unwrap();
    m.get(3, 0);
}

#[test]
fn a_second_phase_end_hook_is_refused() {
    let rt = rt(1);
    let _dsm = Dsm::new(&rt).unwrap();
    struct Other;
    impl hyfi_core::PhaseEnd for Other {
        fn end_phase(
            &self,
            _: usize,
            _: &dyn hyfi_core::NodeLink,
        ) -> Result<(), hyfi_core::LinkError> {
            Ok(())
        }
    }
    let e = rt.set_phase_end(std::sync::Arc::new(Other)).err().unwrap();
    assert!(
        e.to_string().contains("already has a phase-end hook"),
        "{e}"
    );
}

#[test]
fn update_range_updates_in_place_and_checks_its_bounds() {
    let rt = rt(2);
    let dsm = Dsm::new(&rt).unwrap();
    let m = dsm
        .matrix::<f64>(4, 10)
        .from_fn(|i, j| (i * 10 + j) as f64)
        .unwrap();
    let src: Vec<f64> = (0..6).map(|k| k as f64).collect();
    let mut prog = Program::new();
    prog.phase(
        PoolArray::block(&rt, 0..4, 1),
        |ctx, i| m.row_mut(ctx, i).update_range(3, &src, |x, y| x - 2.0 * y),
        |_| Control::Done,
    );
    rt.start(&mut prog).unwrap();
    drop(prog);
    for i in 0..4 {
        for j in 0..10 {
            let want = (i * 10 + j) as f64
                - if (3..9).contains(&j) {
                    2.0 * (j - 3) as f64
                } else {
                    0.0
                };
            assert_eq!(m.get(i, j), want, "({i}, {j})");
        }
    }
    // Past the row's end: a clear panic, nothing written.
    let mut prog = Program::new();
    prog.phase(
        PoolArray::block(&rt, 0..1, 1),
        |ctx, i| m.row_mut(ctx, i).update_range(5, &src, |x, _| x + 100.0),
        |_| Control::Done,
    );
    match rt.start(&mut prog) {
        Err(hyfi_core::Error::FilamentPanic { message, .. }) => {
            assert!(message.contains("out of bounds"), "{message}")
        }
        other => panic!("expected a filament panic, got {other:?}"),
    }
    drop(prog);
    assert_eq!((m.get(0, 5), m.get(0, 9)), (5.0 - 4.0, 9.0));
}

/// Arrays cut one after another from the region do not start at addresses
/// equal modulo 1 MiB (see `region::COLOUR_GAP`): two 1 MiB grids, as a
/// stencil reads one and writes the other, start 1 MiB + 64 KiB apart.
#[test]
fn arrays_allocated_back_to_back_are_not_aligned_alike() {
    let rt = rt(1);
    let dsm = Dsm::new(&rt).unwrap();
    let (rows, cols) = (128, 1024); // 1 MiB of f64
    let a = dsm.matrix::<f64>(rows, cols).zeroed().unwrap();
    let b = dsm.matrix::<f64>(rows, cols).zeroed().unwrap();
    let starts = std::sync::Mutex::new((0usize, 0usize));
    let mut prog = Program::new();
    prog.phase_with(
        PoolArray::block(&rt, 0..1, 1),
        |ctx, _span| (a.read_rows(ctx, 0..1), b.read_rows(ctx, 0..1)),
        |_ctx, _i, (a, b)| {
            *starts.lock().unwrap() = (a.row(0).as_ptr() as usize, b.row(0).as_ptr() as usize);
        },
        |_| Control::Done,
    );
    rt.start(&mut prog).unwrap();
    drop(prog);
    let (pa, pb) = *starts.lock().unwrap();
    assert_eq!(
        pb - pa,
        (1 << 20) + (64 << 10),
        "a at {pa:#x}, b at {pb:#x}"
    );
    assert_ne!((pb - pa) % (1 << 20), 0);
}
