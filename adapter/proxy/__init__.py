"""The buffering proxy (`zeroscale proxy`): holds requests for a workload at zero, wakes it, forwards them.

Its modules by role (tests/proxy/test_package_map.py checks that each is named here):

- the whole: app.py starts and stops the two planes together;
- data plane, the sockets: server.py (listeners, admission, the deadline sweeper, the drain), admin.py (metrics,
  health);
- client ends: client.py (HTTP/1.1, and the hand-over to HTTP/2), h2client.py (HTTP/2, a stream per request);
- upstream ends: upstream.py (HTTP/1.1 connections, `Endpoint` and its pool), h2upstream.py (h2c streams);
- exchange: exchange.py (one request from accept to answer), flow.py (bytes and back-pressure between the ends),
  trace.py (its span, its events, the context it carries upstream; the wake's span);
- wire: headers.py (the header policy), http1.py, h2wire.py and h2conn.py (each protocol's pieces);
- routing: table.py (what the control plane hands the data plane), routing.py (request -> route), route.py
  (endpoints and held requests), choices.py and cold_rules.py (never-wake rules, the waking page);
- counts: counts.py (held and in flight per route), counts_stream.py (their gRPC stream to the adapter);
- control plane: control.py (routes -> table), route_objects.py and claims.py (ZeroscaleRoutes, host owners),
  route_status.py, services.py (per route version), readiness.py and slices.py (EndpointSlices, probes),
  refused.py (refused endpoint addresses), leader.py (the Lease);
- waking: wake.py (the Scale patch), intent.py (what the HPA intends), also_wake.py, activator.py (mode activator);
- the CLI's dry run: dry_run.py (`zeroscale proxy --route-for`).
"""
