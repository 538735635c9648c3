// The probe: reads a model and its optimizer (an IProbeTarget) into the snapshot body, one JSON
// document per call (the fields of optcheck/run/snapshot.py: params, groups, state, optimizer, memory,
// notes, prestep_findings), and the pre-step check that compares the model's parameters, the
// optimizer's members and its state keys by handle and by data pointer. Python makes one call for
// each and decodes with json.loads (docs/dotnet.md, "The boundary").
using System;
using System.Collections.Generic;
using System.Diagnostics;
using System.IO;
using System.Text;
using OptCheck.Contract;

namespace OptCheck.Probe
{
    /// <summary>Optional, next to IProbeTarget: lines the snapshot's notes carry about what the target could
    /// not read (e.g. "optimizer state not readable: ... native optimizer").</summary>
    internal interface IProbeNotes
    {
        IList<string> Notes { get; }
    }

    internal sealed class ProbeCore
    {
        /// <summary>Run a full garbage collection (and pending finalizers) before the memory fields of a snapshot
        /// when a tensor may be waiting for its finalizer, so that live-tensor counts and the managed heap leave out
        /// what is only waiting for the GC (docs/memory.md). On real TorchSharp the collection after 100 steps of the
        /// built-in GPT costs ~48 ms of CPU, nearly all of a snapshot's cost.</summary>
        public bool CollectBeforeMemory = true;

        /// <summary>With DisposeScope statistics (IDisposeScopeStatistics), the collection is skipped while no tensor
        /// can have become garbage since the last read: the training created none outside a DisposeScope and took
        /// none out of one (created/disposed outside, detached, attached counts unchanged since the end of the last
        /// read), which a scoped step never does. A tensor alive at the last collection and dropped since (a kept list
        /// cleared) is still counted until the next one: at most this many reads go without one.</summary>
        public int CollectAtLeastEvery = 10;

        long[] escapesAfterLastRead;
        int readsSinceCollection;

        readonly IProbeTarget target;
        StateReader stateReader;
        object stateOwner;
        readonly List<long> keyBuf = new List<long>();
        // member names by (group, position) at the last check that found nothing: a materialised list keeps
        // its order, so a member disposed since is named by the name it had there
        List<List<string>> lastCleanMembers;

        public ProbeCore(IProbeTarget target)
        {
            if (target == null) throw new ArgumentNullException("target");
            this.target = target;
        }

        /// <summary>The reader of the current optimizer's state: made again when IProbeTarget.StateOwner
        /// returns another object (an optimizer rebuilt on resume), so the live state is always read.</summary>
        public StateReader State
        {
            get {
                object owner = target.StateOwner;
                if (stateReader == null || !ReferenceEquals(owner, stateOwner)) {
                    stateReader = new StateReader(owner, target.StateFieldName);
                    stateOwner = owner;
                }
                return stateReader;
            }
        }

        // -- fingerprint and pre-step check ------------------------------------------------

        static long Mix(long h, long v)
        {
            unchecked {
                h ^= v;
                h *= 1099511628211L;
                h ^= (long)((ulong)h >> 29);
                return h;
            }
        }

        /// <summary>A hash of the model's (handle, data pointer) list, every group's member list and
        /// the state keys: changes when any of them changes identity. One call per step.</summary>
        public long Fingerprint()
        {
            long h = unchecked((long)14695981039346656037UL);
            IList<IParameterView> ps = target.ModelParameters();
            h = Mix(h, ps.Count);
            for (int i = 0; i < ps.Count; i++) { h = Mix(h, ps[i].Handle); h = Mix(h, ps[i].DataPtr); }
            IList<IParamGroupView> gs = target.ParamGroups();
            for (int g = 0; g < gs.Count; g++) {
                IList<IParameterView> ms = gs[g].Members();
                if (ms == null) { h = Mix(h, -7); continue; }   // members not readable (a native optimizer)
                h = Mix(h, -1 - ms.Count);
                for (int i = 0; i < ms.Count; i++) { h = Mix(h, ms[i].Handle); h = Mix(h, ms[i].DataPtr); }
            }
            keyBuf.Clear();
            if (State.Keys(keyBuf)) {
                h = Mix(h, -1000003 - keyBuf.Count);
                for (int i = 0; i < keyBuf.Count; i++) h = Mix(h, keyBuf[i]);
            }
            return h;
        }

        /// <summary>Compare the model's parameters, the optimizer's members and its state keys, by
        /// handle and by data pointer. Returns "" when they agree, else one line per problem
        /// (PreStepProblems, in that order).</summary>
        public string PreStepCheck()
        {
            List<PreStepProblem> ps = PreStepProblems();
            var lines = new string[ps.Count];
            for (int i = 0; i < ps.Count; i++) lines[i] = ps[i].Line;
            return string.Join("\n", lines);
        }

        /// <summary>The pre-step check's problems: disposed members (OC109; the next zero_grad() or step()
        /// throws InvalidOperationException), members with no state (OC108: the next step() throws
        /// KeyNotFoundException for the first one's decimal handle, as TorchSharp's AdamW looks up
        /// _state[param.handle] before the null-grad check), members the model no longer uses by handle and
        /// data (OC101), trainable model parameters in no group (OC102), state keys of no member (OC103).
        /// Empty when they agree. The Python rules OC101, OC102 and OC108 take their findings from this list on TorchSharp
        /// snapshots (the JSON's prestep_findings).</summary>
        public List<PreStepProblem> PreStepProblems()
        {
            IList<IParameterView> ps = target.ModelParameters();
            var modelByHandle = new Dictionary<long, string>();
            var modelByData = new Dictionary<long, string>();
            foreach (IParameterView p in ps) {
                modelByHandle[p.Handle] = p.Name;
                if (p.DataPtr != 0 && !modelByData.ContainsKey(p.DataPtr)) modelByData[p.DataPtr] = p.Name;
            }
            var memberHandles = new HashSet<long>();
            var memberData = new HashSet<long>();
            var noState = new PreStepProblem { Code = "OC108", PredictedException = "System.Collections.Generic.KeyNotFoundException" };
            var stale = new PreStepProblem { Code = "OC101" };
            var gone = new PreStepProblem { Code = "OC109", PredictedException = "System.InvalidOperationException" };
            keyBuf.Clear();
            bool haveKeys = State.Keys(keyBuf);
            var keys = new HashSet<long>(keyBuf);
            bool allMembersRead = true;
            var names = new List<List<string>>();
            IList<IParamGroupView> gs = target.ParamGroups();
            for (int g = 0; g < gs.Count; g++) {
                IList<IParameterView> ms = gs[g].Members();
                var gnames = new List<string>();
                names.Add(gnames);
                if (ms == null) { allMembersRead = false; continue; }  // not readable: nothing is judged from them
                for (int i = 0; i < ms.Count; i++) {
                    IParameterView m = ms[i];
                    if (m.Handle == 0) {  // a disposed tensor (TorchSharp 0.107.0: IsInvalid): its own state, below
                        string was = lastCleanMembers != null && g < lastCleanMembers.Count && i < lastCleanMembers[g].Count
                            ? lastCleanMembers[g][i] : null;
                        gone.Names.Add(was ?? "group " + g + " member " + i);
                        gone.Refs.Add(0);
                        gnames.Add(null);
                        continue;
                    }
                    memberHandles.Add(m.Handle);
                    if (m.DataPtr != 0) memberData.Add(m.DataPtr);
                    string name = NameOf(m, modelByHandle, modelByData);
                    gnames.Add(name);
                    if (haveKeys && !keys.Contains(m.Handle)) { noState.Names.Add(name); noState.Refs.Add(m.Handle); }
                    if (!modelByHandle.ContainsKey(m.Handle) && !(m.DataPtr != 0 && modelByData.ContainsKey(m.DataPtr))) {
                        stale.Names.Add(name); stale.Refs.Add(m.Handle);
                    }
                }
            }
            var untracked = new PreStepProblem { Code = "OC102" };
            if (allMembersRead) {
                foreach (IParameterView p in ps) {
                    if (p.Handle != 0 && p.RequiresGrad && !memberHandles.Contains(p.Handle) && !(p.DataPtr != 0 && memberData.Contains(p.DataPtr))) {
                        untracked.Names.Add(p.Name); untracked.Refs.Add(p.Handle);
                    }
                }
            }
            var orphans = new PreStepProblem { Code = "OC103" };
            if (haveKeys && allMembersRead) foreach (long k in keyBuf) if (!memberHandles.Contains(k)) { orphans.Refs.Add(k); orphans.Names.Add(k.ToString()); }
            var r = new List<PreStepProblem>();
            int disposed = gone.Refs.Count;
            if (disposed > 0) {
                gone.Line = disposed + " optimizer member(s) are disposed tensors (empty handle), the next zero_grad() or step() " +
                            "throws InvalidOperationException (Tensor invalid -- empty handle): " + string.Join(", ", gone.Names.ToArray());
                r.Add(gone);
            }
            // the state the disposed members still own is not orphaned (an approximation without history:
            // the OC103 rule, which has the previous snapshot, still names a real orphan beside them)
            if (orphans.Refs.Count <= disposed) { orphans.Refs.Clear(); orphans.Names.Clear(); }
            if (noState.Refs.Count > 0) {
                noState.PredictedKey = noState.Refs[0].ToString(System.Globalization.CultureInfo.InvariantCulture);
                noState.Line = noState.Refs.Count + " optimizer member(s) have no state, the next step() throws KeyNotFoundException for key " +
                               noState.PredictedKey + ": " + WithHandles(noState);
                r.Add(noState);
            }
            if (stale.Refs.Count > 0) {
                stale.Line = stale.Refs.Count + " optimizer member(s) are not the model's tensors (by handle and data), stepped for nothing: " + WithHandles(stale);
                r.Add(stale);
            }
            if (untracked.Refs.Count > 0) {
                untracked.Line = untracked.Refs.Count + " trainable model parameter(s) in no param group, never trained: " + WithHandles(untracked);
                r.Add(untracked);
            }
            if (orphans.Refs.Count > 0) {
                orphans.Line = orphans.Refs.Count + " optimizer-state key(s) of no member: " + string.Join(", ", orphans.Names.ToArray());
                r.Add(orphans);
            }
            if (r.Count == 0) lastCleanMembers = names;
            return r;
        }

        /// <summary>The name of the model parameter with this handle (a KeyNotFoundException's key), or null.</summary>
        public string ParameterNameOf(long handle)
        {
            foreach (IParameterView p in target.ModelParameters()) if (p.Handle == handle) return p.Name;
            return null;
        }

        static string WithHandles(PreStepProblem p)
        {
            var parts = new string[p.Refs.Count];
            for (int i = 0; i < parts.Length; i++) parts[i] = p.Names[i] + " (handle " + p.Refs[i] + ")";
            return string.Join(", ", parts);
        }

        static string NameOf(IParameterView m, Dictionary<long, string> byHandle, Dictionary<long, string> byData)
        {
            if (m.Name != null) return m.Name;
            string n;
            if (byHandle.TryGetValue(m.Handle, out n)) return n;
            if (m.DataPtr != 0 && byData.TryGetValue(m.DataPtr, out n)) return n;
            return "<handle " + m.Handle + ">";
        }

        // -- the probe ----------------------------------------------------------------------

        /// <summary>The snapshot body as one JSON object (optcheck/run/snapshot.py's field names): params (with
        /// grad_norm, and value_norm / checksum when the view is an IParameterValues), groups (betas as
        /// [beta1, beta2], as PyTorch spells them), state (null when unreadable, notes say why), optimizer,
        /// memory (fields this target cannot measure left out), notes, prestep_findings (PreStepProblems).
        /// Costs one GradNorm per parameter with a grad and one ReadValues per parameter.</summary>
        public string Read()
        {
            return Read(null);
        }

        /// <summary>Read() with <paramref name="note"/> (when not null) first in the snapshot's notes.</summary>
        public string Read(string note)
        {
            long[] escapes = ScopeEscapes();  // before this read's own tensors
            var notes = new List<string>();
            if (note != null) notes.Add(note);
            var targetNotes = target as IProbeNotes;
            if (targetNotes != null && targetNotes.Notes != null) notes.AddRange(targetNotes.Notes);
            var w = new JsonWriter();
            w.BeginObject();
            IList<IParameterView> ps = target.ModelParameters();
            var byHandle = new Dictionary<long, string>();
            var byData = new Dictionary<long, string>();
            w.Name("params").BeginArray();
            foreach (IParameterView p in ps) {
                w.BeginObject();
                w.Name("name").String(p.Name);
                Identity(w, p);
                bool grad = p.HasGrad;
                w.Name("device").String(p.Device ?? "cpu");
                w.Name("grad").String(grad ? "set" : "none");
                // a measured norm is written as it is, NaN and Inf included (OC501 reads them);
                // null only when there is no gradient to measure
                w.Name("grad_norm");
                if (grad) w.Double(p.GradNorm()); else w.Null();
                var values = p as IParameterValues;
                double norm = double.NaN;
                long sum = 0;
                bool haveSum = values != null && values.ReadValues(out norm, out sum);
                w.Name("value_norm");
                if (haveSum) w.Double(norm); else w.Null();
                w.Name("checksum");
                if (haveSum) w.Long(sum); else w.Null();
                w.Name("version").Null();
                w.EndObject();
                byHandle[p.Handle] = p.Name;
                if (p.DataPtr != 0 && !byData.ContainsKey(p.DataPtr)) byData[p.DataPtr] = p.Name;
            }
            w.EndArray();

            IList<IParamGroupView> gs = target.ParamGroups();
            w.Name("groups").BeginArray();
            for (int g = 0; g < gs.Count; g++) {
                w.BeginObject().Name("index").Long(g).Name("options");
                Options(w, gs[g].OptionNames ?? new string[0], gs[g].OptionValues ?? new double[0]);
                IList<IParameterView> members = gs[g].Members();
                if (members == null) {  // not readable (a native optimizer): no member is judged from it
                    w.Name("members").BeginArray().EndArray().Name("members_readable").Bool(false).EndObject();
                    continue;
                }
                w.Name("members").BeginArray();
                foreach (IParameterView m in members) {
                    string name = m.Name;
                    if (name == null && !byHandle.TryGetValue(m.Handle, out name) && !(m.DataPtr != 0 && byData.TryGetValue(m.DataPtr, out name)))
                        name = null;
                    w.BeginObject().Name("name").String(name);
                    Identity(w, m);
                    w.EndObject();
                }
                w.EndArray().EndObject();
            }
            w.EndArray();

            long stateBytes = ReadState(w, notes);
            w.Name("optimizer").BeginObject().Name("type").String(target.OptimizerType ?? "unknown")
             // TorchSharp's optimizers fill _state in add_param_group and look it up at every step (AdamW.cs)
             .Name("state_init").String("eager").EndObject();
            if (NeedsCollection(escapes)) {
                // Tensors dropped without a DisposeScope are freed by finalizers: count what is
                // really alive, not what the GC has not reached yet (docs/memory.md).
                GC.Collect(); GC.WaitForPendingFinalizers(); GC.Collect();
                readsSinceCollection = 0;
            } else {
                readsSinceCollection++;
            }
            w.Name("memory").BeginObject();
            Count(w, "rss_bytes", RssBytes());
            Count(w, "live_tensors", target.LiveTensors);
            Count(w, "peak_tensors", target.PeakTensors);
            Count(w, "managed_bytes", GC.GetTotalMemory(false));
            var scopes = target as IDisposeScopeStatistics;
            if (scopes != null) {
                Count(w, "tensors_created_outside_scope", scopes.TensorsCreatedOutsideScope);
                Count(w, "tensors_disposed_outside_scope", scopes.TensorsDisposedOutsideScope);
            }
            Count(w, "state_bytes", stateBytes);
            w.EndObject();
            w.Name("notes").Strings(notes);
            w.Name("prestep_findings").BeginArray();
            foreach (PreStepProblem pr in PreStepProblems()) {
                w.BeginObject().Name("code").String(pr.Code).Name("line").String(pr.Line)
                 .Name("names").Strings(pr.Names).Name("refs").BeginArray();
                foreach (long h in pr.Refs) w.Long(h);
                w.EndArray();
                if (pr.PredictedException != null) w.Name("predicted_exception").String(pr.PredictedException);
                if (pr.PredictedKey != null) w.Name("predicted_key").String(pr.PredictedKey);
                w.EndObject();
            }
            w.EndArray();
            w.EndObject();
            escapesAfterLastRead = ScopeEscapes();  // this read's own tensors (gradient reads) included
            return w.ToString();
        }

        /// <summary>The target's counts of tensors created outside a DisposeScope, disposed outside one, detached from
        /// one and attached to one; null without DisposeScope statistics.</summary>
        long[] ScopeEscapes()
        {
            var scopes = target as IDisposeScopeStatistics;
            if (scopes == null) return null;
            return new[] { scopes.TensorsCreatedOutsideScope, scopes.TensorsDisposedOutsideScope,
                           scopes.TensorsDetachedFromScope, scopes.TensorsAttachedToScope };
        }

        /// <summary>Whether this read collects before counting (CollectBeforeMemory, CollectAtLeastEvery).</summary>
        bool NeedsCollection(long[] escapes)
        {
            if (!CollectBeforeMemory) return false;
            if (escapes == null || escapesAfterLastRead == null || readsSinceCollection + 1 >= CollectAtLeastEvery) return true;
            for (int i = 0; i < escapes.Length; i++)
                if (escapes[i] < 0 || escapes[i] != escapesAfterLastRead[i]) return true;
            return false;
        }

        static void Identity(JsonWriter w, IParameterView p)
        {
            w.Name("ref").Long(p.Handle).Name("data_ptr").Long(p.DataPtr).Name("shape").Longs(p.Shape ?? new long[0])
             .Name("dtype").String(DTypes.Normalize(p.DType)).Name("is_leaf").Bool(p.IsLeaf).Name("requires_grad").Bool(p.RequiresGrad);
        }

        static void Count(JsonWriter w, string name, long v)
        {
            if (v >= 0) w.Name(name).Long(v);
        }

        /// <summary>Group options in PyTorch's shape: beta1 and beta2 become "betas": [beta1, beta2] (after
        /// the others); flags (amsgrad, maximize) stay numbers; a NaN option (left null) is NaN.</summary>
        static void Options(JsonWriter w, string[] names, double[] values)
        {
            int k = Math.Min(names.Length, values.Length);
            int b1 = Array.IndexOf(names, "beta1"), b2 = Array.IndexOf(names, "beta2");
            bool betas = b1 >= 0 && b2 >= 0 && b1 < k && b2 < k;
            w.BeginObject();
            for (int j = 0; j < k; j++) {
                if (betas && (j == b1 || j == b2)) continue;
                w.Name(names[j]).Double(values[j]);
            }
            if (betas) w.Name("betas").BeginArray().Double(values[b1]).Double(values[b2]).EndArray();
            w.EndObject();
        }

        static int ElementSize(string dtype)
        {
            switch (dtype) {
                case "float64": case "int64": return 8;
                case "float16": case "bfloat16": return 2;
                default: return 4;
            }
        }

        /// <summary>Writes "state" (null when unreadable, with the reason in notes); returns the state
        /// tensors' bytes, or -1 when unreadable.</summary>
        long ReadState(JsonWriter w, List<string> notes)
        {
            var keys = new List<object>(); var values = new List<object>();
            bool ok;
            StateReader state = State;
            string why = state.Problem;
            try { ok = state.Entries(keys, values); }
            catch (Exception e) { ok = false; why = "optimizer state not readable: " + e.GetType().FullName + ": " + e.Message; }
            w.Name("state");
            if (!ok) {
                // one line saying why: the target's own (IProbeNotes) when it gave one
                if (!notes.Exists(n => n.StartsWith("optimizer state not readable", StringComparison.Ordinal)) || state.Readable)
                    notes.Add(why ?? "optimizer state not readable: the state field is not enumerable");
                w.Null();
                return -1;
            }
            long bytes = 0;
            w.BeginArray();
            for (int i = 0; i < keys.Count; i++) {
                StateView sv = target.DescribeState(keys[i], values[i]) ?? StateReader.Describe(values[i]);
                w.BeginObject().Name("ref").Long(StateReader.KeyToLong(keys[i])).Name("step");
                if (sv.Step >= 0) w.Long(sv.Step); else w.Null();
                w.Name("tensors").BeginObject();
                for (int j = 0; j < sv.TensorNames.Count; j++) {
                    string dt = DTypes.Normalize(sv.TensorDTypes[j]);
                    long n = 1;
                    foreach (long d in sv.TensorShapes[j]) n *= d;
                    bytes += n * ElementSize(dt);
                    w.Name(sv.TensorNames[j]).BeginObject().Name("shape").Longs(sv.TensorShapes[j]).Name("dtype").String(dt).EndObject();
                }
                w.EndObject().EndObject();
            }
            w.EndArray();
            return bytes;
        }

        /// <summary>Resident set size in bytes from /proc/self/statm (Linux); -1 elsewhere.</summary>
        public static long RssBytes()
        {
            try {
                string[] f = File.ReadAllText("/proc/self/statm").Split(' ');
                return long.Parse(f[1]) * Environment.SystemPageSize;
            } catch (Exception) {
                return -1;
            }
        }
    }
}
