// Ref: issue 7: fast Verilator harness; sim/serve_hw.py (HostBus handshake, LightGmii
//      framing: 7 x 0x55, 0xD5, frame, FCS, gap); hw/target/hostlink.py (host bus); IEEE 802.3 CRC-32.
//
// C++ main around the Verilated KbtpTarget (class Vtop). It owns the clock, the GMII pins and the
// host bus, and talks to sim/vltarget.py over stdin/stdout with a little-endian binary protocol,
// so a run of N cycles costs no Python at all. Request: one opcode octet and its arguments.
// Every reply starts with the common "events" block, then the command's own result:
//
//   events  = u64 cycle, u32 n_rx, n_rx x (u64 first, u64 last),
//             u32 n_tx, n_tx x (u64 start, u64 end, u8 fcs_ok, u32 len, len octets)
//   'S' u32 len, u8 fcs_ok, u32 gap, octets     -> events                (queue one RX frame)
//   'R' u64 cycles, u8 until_tx                 -> events
//   'A' u8 space, u32 addr, u8 we, u32 wdata    -> events, u32 rdata, u8 err
//   'W' u32 addr, u32 n_words, n_words x u32    -> events, u8 err, u32 at (first refused addr)
//   'M' u32 addr, u32 n_words                   -> events, u8 err, u32 at, n_words x u32
//   'Q'                                         -> events, then exit
//
// err values: 1 = the target answered err, 2 = no ack within ACK_LIMIT cycles.
// The cycle count starts at 0 after reset. An RX octet is counted in the cycle in which it is
// on rxd (sampled by the rising edge that ends that cycle); a TX octet in the cycle in which
// it is on txd (it appears after the rising edge that starts that cycle).
//
// Two tops, chosen at compile time:
// - default: hw/target/target.py KbtpTarget, one clock (clk), GMII ports rxd.., host bus host__*;
// - KBTP_CORE_DIV=n: the board's core (boards/cores.py KbtpCore, as the bitstream holds it):
//   GMII (gmii__*) and the MAC in ``sync`` (clk), everything after the MAC and the host bus
//   (bus__*) in ``core`` (core_clk), whose period is n GMII cycles (ECPIX-5: 125 MHz / 5 =
//   25 MHz). The core clock rises at the falling edge of clk in every n-th GMII cycle, so
//   the two domains never share an edge. Cycle counts stay GMII cycles (8 ns); a host-bus
//   access is held from one core edge to the core edge after the one that showed ack, as the
//   board's host link does.
// - KBTP_XGMII: hw/target/xgmii_target.py XgmiiKbtpTarget (width 64, one clock, clk, at
//   156.25 MHz): XGMII pins xgmii_rxd/rxc (64 + 8 bits, lane 0 the first octet) instead of
//   GMII (IEEE 802.3 clause 46).
//   Frames go in as /S/ (0xFB, control) in lane 0 or 4 in place of the first preamble octet,
//   6 x 0x55, 0xD5, the frame, its FCS and /T/ (0xFD), which is the first octet of the gap;
//   the gap is rounded to the next start lane (0 or 4) with the deficit idle count of
//   §46.3.1.4 (up to 3 octets shorter, made up later), so that frames sent back to back with a
//   12-octet gap take on average exactly what they take on GMII. Counts are octet times (one
//   octet of the 10 Gb/s line, 0.8 ns; 8 per clock cycle) so that every figure the Python side
//   computes keeps its GMII meaning: an RX octet's time is 8 x its cycle + its lane; 'R' runs
//   whole cycles until at least the asked octet times have passed.

#include "Vtop.h"
#include "verilated.h"
#ifdef KBTP_TRACE
// A waveform for debugging (sim/vltarget.py: KBTP_VL_TRACE=<first GMII cycle>[:<cycles>] builds
// with --trace-fst; the file is KBTP_VL_TRACE_FILE or trace.fst). Time unit: half a GMII cycle.
#include "verilated_fst_c.h"
#endif

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <algorithm>
#include <deque>
#include <unistd.h>
#include <vector>

// Verilator escapes the double underscore of the interface ports (host__addr -> host___05Faddr).
#if defined(KBTP_CORE_DIV) && defined(KBTP_XGMII)
#error "the XGMII target has one clock"
#endif
#ifdef KBTP_CORE_DIV
#define HOST(name) bus___05F##name
#define GMII(name) gmii___05F##name
#else
#define HOST(name) host___05F##name
#define GMII(name) name
#endif

namespace {

constexpr int ACK_LIMIT = 10000;
constexpr uint8_t SPACE_MEM = 1;          // hw/target/hostlink.py Space.MEM

Vtop* top;
uint64_t cyc = 0;
int out_fd = 1;

// ---- CRC-32 (IEEE 802.3, reflected, as zlib.crc32) ----------------------------------------
uint32_t crc_table[256];
void crc_init() {
    for (uint32_t n = 0; n < 256; n++) {
        uint32_t c = n;
        for (int k = 0; k < 8; k++) c = (c & 1) ? 0xEDB88320u ^ (c >> 1) : c >> 1;
        crc_table[n] = c;
    }
}
uint32_t crc32(const uint8_t* p, size_t n) {
    uint32_t c = 0xFFFFFFFFu;
    for (size_t i = 0; i < n; i++) c = crc_table[(c ^ p[i]) & 0xFF] ^ (c >> 8);
    return c ^ 0xFFFFFFFFu;
}

// ---- pipe I/O -------------------------------------------------------------------------------
void read_all(void* buf, size_t n) {
    uint8_t* p = static_cast<uint8_t*>(buf);
    while (n) {
        ssize_t r = read(0, p, n);
        if (r <= 0) exit(0);                    // parent gone: nothing left to do
        p += r;
        n -= size_t(r);
    }
}
template <typename T> T rd() { T v; read_all(&v, sizeof v); return v; }

std::vector<uint8_t> obuf;
template <typename T> void put(T v) {
    const uint8_t* p = reinterpret_cast<const uint8_t*>(&v);
    obuf.insert(obuf.end(), p, p + sizeof v);
}
void put_bytes(const uint8_t* p, size_t n) { obuf.insert(obuf.end(), p, p + n); }
void flush() {
    const uint8_t* p = obuf.data();
    size_t n = obuf.size();
    while (n) {
        ssize_t w = write(out_fd, p, n);
        if (w <= 0) exit(0);
        p += w;
        n -= size_t(w);
    }
    obuf.clear();
}

// ---- transmit side, either interface: a frame's octets from its first preamble octet ---------
// (tx_bad: the interface marked an error inside the frame; the frame then has no body.)
struct TxFrame { uint64_t start, end; bool fcs_ok; std::vector<uint8_t> body; };
std::vector<TxFrame> tx_done;
std::vector<uint8_t> tx_oct;
bool tx_busy = false, tx_bad = false;
uint64_t tx_start = 0, tx_last = 0;

void tx_finish() {
    TxFrame f{tx_start, tx_last, false, {}};
    size_t k = 0;
    while (k < tx_oct.size() && tx_oct[k] == 0x55) k++;
    if (!tx_bad && k < tx_oct.size() && tx_oct[k] == 0xD5 && tx_oct.size() >= k + 1 + 4) {
        const uint8_t* b = tx_oct.data() + k + 1;
        size_t n = tx_oct.size() - k - 1 - 4;
        f.body.assign(b, b + n);
        uint32_t fcs;
        memcpy(&fcs, b + n, 4);
        f.fcs_ok = crc32(b, n) == fcs;
    }
    tx_done.push_back(std::move(f));
    tx_oct.clear();
    tx_busy = tx_bad = false;
}

#ifdef KBTP_XGMII
// ---- XGMII receive side (frames into the target) -------------------------------------------
// A frame's wire is preamble + SFD + frame + FCS as on GMII; its first octet goes out as /S/.
struct RxFrame { std::vector<uint8_t> wire; uint32_t gap; };
std::deque<RxFrame> rxq;
bool rx_active = false;
size_t rx_pos = 0;
uint32_t rx_idle = 0;           // idle octets still owed before the next /S/ (after /T/)
int rx_deficit = 0;             // deficit idle count (0..3), IEEE 802.3 §46.3.1.4
uint64_t rx_first = 0;
std::vector<std::pair<uint64_t, uint64_t>> rx_log;
constexpr uint8_t XG_IDLE = 0x07, XG_START = 0xFB, XG_TERM = 0xFD;

inline void drive_rx() {
    uint64_t d = 0;
    uint8_t c = 0;
    for (int lane = 0; lane < 8; lane++) {
        uint8_t oct = XG_IDLE;
        bool ctl = true;
        if (!rx_active && rx_idle == 0 && !rxq.empty() && (lane == 0 || lane == 4)) {
            rx_active = true;
            rx_pos = 0;
            rx_first = cyc + lane;
        }
        if (rx_active) {
            const RxFrame& f = rxq.front();
            if (rx_pos < f.wire.size()) {
                oct = rx_pos == 0 ? XG_START : f.wire[rx_pos];
                ctl = rx_pos == 0;
                if (++rx_pos == f.wire.size()) rx_log.emplace_back(rx_first, cyc + lane);
            } else {
                // /T/: the first octet of the gap. The gap ends at the next start lane, or up
                // to 3 octets before it while the deficit allows (then made up later).
                oct = XG_TERM;
                uint32_t gap = f.gap ? f.gap : 1;
                uint32_t end = uint32_t(lane) + gap;           // lane after the gap, unaligned
                uint32_t over = end % 4;
                if (over && gap > over && rx_deficit + int(over) <= 3) {
                    rx_deficit += int(over);
                    gap -= over;
                } else if (over) {
                    rx_deficit = std::max(0, rx_deficit - int(4 - over));
                    gap += 4 - over;
                }
                rx_idle = gap - 1;
                rx_active = false;
                rxq.pop_front();
            }
        } else if (rx_idle) {
            rx_idle--;
        } else if (rxq.empty()) {
            rx_deficit = 0;     // the line idles: no gap to make up
        }
        d |= uint64_t(oct) << (8 * lane);
        c |= uint8_t(ctl) << lane;
    }
    top->xgmii_rxd = d;
    top->xgmii_rxc = c;
}

// ---- XGMII transmit side (frames out of the target) ----------------------------------------

// The octets on txd in the cycle that ends at ``cyc`` (octet times): sampled after the edge.
inline void sample_tx(uint64_t at) {
    uint64_t d = top->xgmii_txd;
    uint8_t c = top->xgmii_txc;
    for (int lane = 0; lane < 8; lane++) {
        uint8_t oct = uint8_t(d >> (8 * lane));
        bool ctl = (c >> lane) & 1;
        if (!tx_busy) {
            if (ctl && oct == XG_START) {
                tx_busy = true;
                tx_start = at + lane;
                tx_oct.push_back(0x55);          // /S/ stands for the first preamble octet
            }
        } else if (ctl && oct == XG_TERM) {
            tx_finish();
        } else {
            if (ctl) tx_bad = true;               // /E/ or any other control inside a frame
            tx_oct.push_back(oct);
            tx_last = at + lane;
        }
    }
}

#else
// ---- GMII receive side (frames into the target) --------------------------------------------
struct RxFrame { std::vector<uint8_t> wire; uint32_t gap; };
std::deque<RxFrame> rxq;
bool rx_active = false;
size_t rx_pos = 0;
uint32_t rx_gap = 0;
uint64_t rx_first = 0;
std::vector<std::pair<uint64_t, uint64_t>> rx_log;

inline void drive_rx() {
    if (!rx_active) {
        if (rx_gap) { rx_gap--; top->GMII(rx_dv) = 0; return; }
        if (rxq.empty()) { top->GMII(rx_dv) = 0; return; }
        rx_active = true;
        rx_pos = 0;
        rx_first = cyc;
    }
    const RxFrame& f = rxq.front();
    top->GMII(rxd) = f.wire[rx_pos++];
    top->GMII(rx_dv) = 1;
    if (rx_pos == f.wire.size()) {
        rx_log.emplace_back(rx_first, cyc);
        rx_gap = f.gap;
        rx_active = false;
        rxq.pop_front();
    }
}

// ---- GMII transmit side (frames out of the target) -----------------------------------------

inline void sample_tx() {
    if (top->GMII(tx_en)) {
        if (!tx_busy) { tx_busy = true; tx_start = cyc; }
        tx_oct.push_back(uint8_t(top->GMII(txd)));
        tx_last = cyc;
    } else if (tx_busy) {
        tx_finish();
    }
}

#endif  // KBTP_XGMII

#ifdef KBTP_TRACE
VerilatedFstC* tfp = nullptr;
uint64_t trace_from = 0, trace_to = ~0ull, trace_t = 0;
bool trace_closed = false;
void trace_close() {
    if (tfp && !trace_closed) tfp->close();
    trace_closed = true;
}
inline void dump() {
    trace_t++;
    if (cyc < trace_from || cyc > trace_to || trace_closed) return;
    if (!tfp) {
        tfp = new VerilatedFstC;
        top->trace(tfp, 99);
        const char* f = getenv("KBTP_VL_TRACE_FILE");
        tfp->open(f ? f : "trace.fst");
    }
    tfp->dump(trace_t);
    if (cyc == trace_to) trace_close();
}
#else
inline void dump() {}
inline void trace_close() {}
#endif

// One clock cycle in two halves: inputs applied and combinational logic settled with the clock
// low (a host-bus ack is visible here), then the rising edge.
#ifdef KBTP_CORE_DIV
constexpr int CORE_DIV = KBTP_CORE_DIV;
static_assert(CORE_DIV >= 2, "the core clock must be slower than the GMII clock");
int phase = 0;                  // GMII cycle within the core clock's period
bool core_rose = false;         // the core clock rose in the last step()
inline void half_low() {
    drive_rx();
    top->clk = 0;
    core_rose = phase == 0;
    if (core_rose) top->core_clk = 1;
    else if (phase == CORE_DIV / 2) top->core_clk = 0;
    top->eval();
    dump();
}
inline void half_high() {
    top->clk = 1;
    top->eval();
    dump();
    cyc++;
    phase = phase + 1 == CORE_DIV ? 0 : phase + 1;
    sample_tx();
}
inline void step() { half_low(); half_high(); }
// GMII cycles up to and including the next rising edge of the core clock.
inline void core_step() { do step(); while (!core_rose); }
// The host bus is in the core domain; its ack is a flop of HostBusRegister, so it is settled
// between core edges: a bus cycle is a core cycle.
inline void bus_settle() {}
inline void bus_edge() { core_step(); }
#else
inline void half_low() {
    drive_rx();
    top->clk = 0;
    top->eval();
    dump();
}
inline void half_high() {
    top->clk = 1;
    top->eval();
    dump();
#ifdef KBTP_XGMII
    cyc += 8;           // ``cyc`` counts octet times: 8 per clock cycle
    sample_tx(cyc);
#else
    cyc++;
    sample_tx();
#endif
}
inline void step() { half_low(); half_high(); }
// The host bus is in the one clock: ack may come combinationally, so it is looked at with the
// clock low, before the edge that accepts the request.
inline void bus_settle() { half_low(); }
inline void bus_edge() { half_high(); }
#endif

// One host-bus transaction (sim/serve_hw.py HostBus): request held until ack, sampled before the
// edge that accepts it; returns err (0, 1, or 2 = no answer).
int access(uint8_t space, uint32_t addr, bool we, uint32_t wdata, uint32_t* rdata) {
    top->HOST(space) = space;
    top->HOST(addr) = addr;
    top->HOST(wdata) = wdata;
    top->HOST(we) = we;
    top->HOST(re) = !we;
    for (int i = 0; i < ACK_LIMIT; i++) {
        bus_settle();
        if (top->HOST(ack)) {
            *rdata = top->HOST(rdata);
            int err = top->HOST(err) ? 1 : 0;
            bus_edge();
            top->HOST(we) = 0;
            top->HOST(re) = 0;
            return err;
        }
        bus_edge();
    }
    top->HOST(we) = 0;
    top->HOST(re) = 0;
    *rdata = 0;
    return 2;
}

void put_events() {
    put<uint64_t>(cyc);
    put<uint32_t>(uint32_t(rx_log.size()));
    for (auto& e : rx_log) { put<uint64_t>(e.first); put<uint64_t>(e.second); }
    rx_log.clear();
    put<uint32_t>(uint32_t(tx_done.size()));
    for (auto& f : tx_done) {
        put<uint64_t>(f.start);
        put<uint64_t>(f.end);
        put<uint8_t>(f.fcs_ok);
        put<uint32_t>(uint32_t(f.body.size()));
        put_bytes(f.body.data(), f.body.size());
    }
    tx_done.clear();
}

}  // namespace

int main(int argc, char** argv) {
    // Keep the protocol channel away from anything the model might print on stdout.
    out_fd = dup(1);
    dup2(2, 1);
    Verilated::commandArgs(argc, argv);
#ifdef KBTP_TRACE
    Verilated::traceEverOn(true);
    if (const char* t = getenv("KBTP_VL_TRACE")) {
        trace_from = strtoull(t, nullptr, 10);
        if (const char* c = strchr(t, ':')) trace_to = trace_from + strtoull(c + 1, nullptr, 10);
    }
    // FST keeps its last blocks in memory: close the file on every exit (the parent gone, too).
    atexit([] { trace_close(); });
#endif
    crc_init();
    top = new Vtop;
    top->clk = 0;
    top->rst = 1;
#ifdef KBTP_XGMII
    top->xgmii_rxd = 0x0707070707070707ull;
    top->xgmii_rxc = 0xFF;
#else
    top->GMII(rx_dv) = top->GMII(rx_er) = top->GMII(rxd) = 0;
#endif
    top->HOST(we) = top->HOST(re) = top->HOST(space) = 0;
    top->HOST(addr) = top->HOST(wdata) = 0;
#ifdef KBTP_CORE_DIV
    top->core_clk = 0;
    top->core_rst = 1;
    top->eval();
    for (int i = 0; i < 5; i++) core_step();
    top->rst = 0;
    top->core_rst = 0;
    for (int i = 0; i < 2; i++) core_step();
    // Cycle 0 is the GMII cycle right after a rising edge of the core clock.
#else
    top->eval();
    for (int i = 0; i < 5; i++) step();
    top->rst = 0;
    for (int i = 0; i < 2; i++) step();
#endif
    cyc = 0;
    tx_done.clear();
    rx_log.clear();
    put<uint32_t>(0x4B425450);                      // "KBTP": ready
    flush();

    for (;;) {
        uint8_t op = rd<uint8_t>();
        switch (op) {
        case 'S': {
            uint32_t len = rd<uint32_t>();
            uint8_t fcs_ok = rd<uint8_t>();
            uint32_t gap = rd<uint32_t>();
            RxFrame f;
            f.gap = gap;
            f.wire.assign(7, 0x55);
            f.wire.push_back(0xD5);
            size_t at = f.wire.size();
            f.wire.resize(at + len + 4);
            read_all(f.wire.data() + at, len);
            uint32_t fcs = crc32(f.wire.data() + at, len);
            if (!fcs_ok) fcs ^= 0xFFFFFFFFu;
            memcpy(f.wire.data() + at + len, &fcs, 4);
            rxq.push_back(std::move(f));
            put_events();
            break;
        }
        case 'R': {
            uint64_t n = rd<uint64_t>();
            bool until_tx = rd<uint8_t>();
            uint64_t until = cyc + n;
            if (until_tx) {
                while (cyc < until && tx_done.empty()) step();
            } else {
                while (cyc < until) step();
            }
            put_events();
            break;
        }
        case 'A': {
            uint8_t space = rd<uint8_t>();
            uint32_t addr = rd<uint32_t>();
            uint8_t we = rd<uint8_t>();
            uint32_t wdata = rd<uint32_t>();
            uint32_t rdata = 0;
            int err = access(space, addr, we, wdata, &rdata);
            put_events();
            put<uint32_t>(rdata);
            put<uint8_t>(uint8_t(err));
            break;
        }
        case 'W': {
            uint32_t addr = rd<uint32_t>();
            uint32_t n = rd<uint32_t>();
            std::vector<uint32_t> w(n);
            read_all(w.data(), size_t(n) * 4);
            int err = 0;
            uint32_t at = 0, dummy;
            for (uint32_t i = 0; i < n && !err; i++) {
                at = addr + 4 * i;
                err = access(SPACE_MEM, at, true, w[i], &dummy);
            }
            put_events();
            put<uint8_t>(uint8_t(err));
            put<uint32_t>(err ? at : 0);
            break;
        }
        case 'M': {
            uint32_t addr = rd<uint32_t>();
            uint32_t n = rd<uint32_t>();
            std::vector<uint32_t> w(n, 0);
            int err = 0;
            uint32_t at = 0;
            for (uint32_t i = 0; i < n && !err; i++) {
                at = addr + 4 * i;
                err = access(SPACE_MEM, at, false, 0, &w[i]);
            }
            put_events();
            put<uint8_t>(uint8_t(err));
            put<uint32_t>(err ? at : 0);
            put_bytes(reinterpret_cast<uint8_t*>(w.data()), size_t(n) * 4);
            break;
        }
        case 'Q':
            put_events();
            flush();
            trace_close();
            top->final();
            delete top;
            return 0;
        default:
            fprintf(stderr, "vl harness: unknown command %d\n", op);
            return 3;
        }
        flush();
    }
}
