// The fluid scale-up model (see fluid.h). Rates are in bytes per picosecond (bps / 8e12);
// remaining bytes are doubles, so a re-solve never loses a byte to rounding, and completion
// times are rounded up to the next picosecond (htsim's clock).
#include "fluid.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "replay.h"

namespace xsim {

FluidGroup::FluidGroup(EventList& ev, Replayer* owner, const Input& in, FluidScratch* scratch)
    : EventSource(ev, "xsim_fluid"), _owner(owner), _in(in), _s(scratch) {}

void FluidGroup::add(uint32_t op, uint64_t bytes, int32_t route) {
    advance();
    _active.push_back(Flow{op, route, (double)bytes, 0.0});
    resolve();
}

void FluidGroup::capacity_changed() {
    advance();
    resolve();
}

void FluidGroup::reroute(uint32_t op, int32_t route) {
    advance();
    for (Flow& f : _active)
        if (f.op == op) f.route = route;  // its last byte then crosses the new route
    resolve();
}

void FluidGroup::advance() {
    simtime_picosec now = eventlist().now();
    if (now > _last) {
        double dt = (double)(now - _last);
        for (Flow& f : _active) f.rem -= f.rate * dt;
    }
    _last = now;
}

void FluidGroup::doNextEvent() {
    _armed = false;  // the handle has fired: it must not be cancelled any more
    advance();
    size_t keep = 0;
    std::vector<std::pair<uint32_t, simtime_picosec>>& done = _done;
    done.clear();
    for (size_t i = 0; i < _active.size(); i++) {
        Flow& f = _active[i];
        // Done if the rest would take under half a picosecond (the clock's resolution).
        if (f.rem <= f.rate * 0.5 + 1e-9) {
            simtime_picosec lat = 0;
            for (uint32_t l : _in.routes[f.route]) lat += _in.links[l].latency_ps;
            done.emplace_back(f.op, lat);  // the last byte still crosses the path
        } else {
            _active[keep++] = f;
        }
    }
    _active.resize(keep);
    resolve();
    // Only now: with zero latency a completion starts successors at once, and a successor
    // may be a fluid flow joining this very group.
    for (const auto& d : done) _owner->finish_after(d.first, d.second);
}

// Progressive filling (max-min fairness) over the links this group's active flows use, then
// one timer at the earliest last byte. The same algorithm as the ns-3 engine's FluidResolve
// (plugins/ns3/xsim_ns3/engine.cpp) and the flow backend's reference
// (xsim_adapters/backends/flow/maxmin.py); the copies are cross-tested on the same traces in
// tests/test_fluid_engines.py (within one clock tick per rate change).
void FluidGroup::resolve() {
    _recomputes++;
    if (_armed) {
        eventlist().cancelPendingSourceByHandle(*this, _handle);
        _armed = false;
    }
    if (_active.empty()) return;
    std::vector<double>& resid = _s->resid;
    std::vector<uint32_t>& cnt = _s->count;
    std::vector<uint32_t>& used = _s->used;
    used.clear();
    for (const Flow& f : _active)
        for (uint32_t l : _in.routes[f.route]) {
            if (cnt[l] == 0) {
                resid[l] = _s->cap[l];
                used.push_back(l);
            }
            cnt[l]++;
        }
    // each link's flows, in _active order (the order the freezing below visits them)
    std::vector<uint32_t>& start = _s->start;
    std::vector<uint32_t>& fill = _s->fill;
    std::vector<uint32_t>& on_link = _s->flows;
    uint32_t total = 0;
    for (uint32_t l : used) {
        start[l] = total;
        fill[l] = 0;
        total += cnt[l];
    }
    on_link.resize(total);
    for (size_t i = 0; i < _active.size(); i++)
        for (uint32_t l : _in.routes[_active[i].route]) on_link[start[l] + fill[l]++] = (uint32_t)i;
    std::vector<char>& frozen = _s->frozen;
    frozen.assign(_active.size(), 0);
    size_t left = _active.size();
    while (left > 0) {
        // The bottleneck: the link with the smallest equal share for its unfrozen flows.
        int64_t best = -1;
        double share = 0;
        for (uint32_t l : used)
            if (cnt[l] > 0) {
                double s = std::max(0.0, resid[l]) / (double)cnt[l];
                if (best < 0 || s < share) {
                    best = l;
                    share = s;
                }
            }
        if (best < 0) break;
        // the unfrozen flows crossing the bottleneck, in _active order (as a scan of every
        // flow would find them: the same rates to the last bit)
        const uint32_t* hit = on_link.data() + start[best];
        const uint32_t* hit_end = hit + fill[best];
        for (; hit != hit_end; ++hit) {
            const size_t i = *hit;
            if (frozen[i]) continue;
            const std::vector<uint32_t>& hops = _in.routes[_active[i].route];
            frozen[i] = 1;
            left--;
            _active[i].rate = share;
            for (uint32_t l : hops) {
                resid[l] -= share;
                cnt[l]--;
            }
        }
    }
    for (uint32_t l : used) cnt[l] = 0;  // leave the scratch clean for the next group
    double next = INFINITY;
    for (const Flow& f : _active)
        if (f.rate > 0) next = std::min(next, std::max(0.0, f.rem) / f.rate);
    if (std::isfinite(next)) {
        simtime_picosec dt = std::max<simtime_picosec>(1, (simtime_picosec)std::ceil(next - 1e-6));
        _handle = eventlist().sourceIsPendingGetHandle(*this, eventlist().now() + dt);
        _armed = true;
    }
}

}  // namespace xsim
