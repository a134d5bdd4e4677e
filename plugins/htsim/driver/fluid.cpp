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
        // Done if the rest would take under half a picosecond (htsim's clock tick).
        if (fluid_done(f.rem, f.rate)) {
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

// Progressive filling (max-min fairness) over the links this group's active flows use, by the
// solver every compiled engine shares (xsim/maxmin.hpp: the flow backend's compiled core and
// the ns-3 engine use the same one), then one timer at the earliest last byte.
void FluidGroup::resolve() {
    _recomputes++;
    if (_armed) {
        eventlist().cancelPendingSourceByHandle(*this, _handle);
        _armed = false;
    }
    if (_active.empty()) return;
    std::vector<double>& rate = _s->rate;
    rate.resize(_active.size());
    _s->solver.solve(
        _active.size(),
        [this](size_t i) -> const std::vector<uint32_t>& { return _in.routes[_active[i].route]; },
        _s->cap.data(), rate.data());
    for (size_t i = 0; i < _active.size(); i++) _active[i].rate = rate[i];
    double next = INFINITY;
    for (const Flow& f : _active)
        if (f.rate > 0) next = std::min(next, std::max(0.0, f.rem) / f.rate);
    if (std::isfinite(next)) {
        simtime_picosec dt = (simtime_picosec)fluid_wait_ticks(next);
        _handle = eventlist().sourceIsPendingGetHandle(*this, eventlist().now() + dt);
        _armed = true;
    }
}

}  // namespace xsim
