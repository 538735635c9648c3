// The probe: reads a model and its optimizer (an IProbeTarget) into a few flat arrays per
// call, and the pre-step check that compares the model's parameters, the optimizer's members
// and its state keys by handle and by data pointer. Python makes one call for each
// (docs/torchsharp.md: one call returning arrays ~10 µs, against ~200 µs walking 30 parameters
// attribute by attribute through pythonnet).
using System;
using System.Collections.Generic;
using System.Diagnostics;
using System.IO;
using System.Text;

namespace OptCheck.Probe
{
    /// <summary>One probe reading, as parallel flat arrays (see optcheck/torchsharp_bridge/convert.py).
    /// Flags: bit 0 is_leaf, bit 1 requires_grad, bit 2 grad set. Shapes: ranks in *Ranks, the
    /// dimensions of all tensors concatenated in *Shapes.</summary>
    public sealed class ProbeArrays
    {
        public string[] ParamNames;
        public long[] ParamHandles, ParamDataPtrs, ParamShapes;
        public int[] ParamFlags, ParamRanks;
        public double[] ParamGradNorms;
        public string[] ParamDTypes, ParamDevices;

        public int[] GroupSizes, GroupOptionCounts;
        public string[] GroupOptionNames;
        public double[] GroupOptionValues;

        public string[] MemberNames;   // null entries: the member is not a model parameter by handle or data
        public long[] MemberHandles, MemberDataPtrs, MemberShapes;
        public int[] MemberFlags, MemberRanks;
        public string[] MemberDTypes;

        public bool StateReadable;
        public long[] StateKeys, StateSteps, StateTensorShapes;
        public int[] StateTensorCounts, StateTensorRanks;
        public string[] StateTensorNames, StateTensorDTypes;

        public string OptimizerType;
        public long LiveTensors, PeakTensors, ManagedBytes, RssBytes;
        /// <summary>IDisposeScopeStatistics of the target; -1 = unknown.</summary>
        public long CreatedOutsideScope = -1, DisposedOutsideScope = -1;
        public string[] Notes;
        /// <summary>Seconds spent inside Probe() (the .NET side of a snapshot's cost).</summary>
        public double ProbeSeconds;
    }

    public sealed class ProbeCore
    {
        /// <summary>Run a full garbage collection (and pending finalizers) before the
        /// memory fields of a snapshot, so that live-tensor counts and the managed heap
        /// leave out what is only waiting for the GC. Costs a few ms per snapshot.</summary>
        public bool CollectBeforeMemory = true;

        public const int Leaf = 1, RequiresGrad = 2, GradSet = 4;

        readonly IProbeTarget target;
        readonly StateReader state;
        readonly List<long> keyBuf = new List<long>();

        public ProbeCore(IProbeTarget target)
        {
            if (target == null) throw new ArgumentNullException("target");
            this.target = target;
            state = new StateReader(target.StateOwner, target.StateFieldName);
        }

        public StateReader State { get { return state; } }

        static int Flags(IParameterView p)
        {
            return (p.IsLeaf ? Leaf : 0) | (p.RequiresGrad ? RequiresGrad : 0) | (p.HasGrad ? GradSet : 0);
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
                h = Mix(h, -1 - ms.Count);
                for (int i = 0; i < ms.Count; i++) { h = Mix(h, ms[i].Handle); h = Mix(h, ms[i].DataPtr); }
            }
            keyBuf.Clear();
            if (state.Keys(keyBuf)) {
                h = Mix(h, -1000003 - keyBuf.Count);
                for (int i = 0; i < keyBuf.Count; i++) h = Mix(h, keyBuf[i]);
            }
            return h;
        }

        /// <summary>Compare the model's parameters, the optimizer's members and its state keys, by
        /// handle and by data pointer. Returns "" when they agree, else one line per problem:
        /// members with no state (the next step() throws KeyNotFoundException for the first one's
        /// decimal handle, as TorchSharp's AdamW looks up _state[param.handle] before the null-grad
        /// check), members the model no longer uses (by handle and data), trainable model parameters
        /// in no group, and state keys of no member.</summary>
        public string PreStepCheck()
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
            var noState = new List<string>();
            var stale = new List<string>();
            keyBuf.Clear();
            bool haveKeys = state.Keys(keyBuf);
            var keys = new HashSet<long>(keyBuf);
            long firstMissing = 0;
            int disposed = 0;
            foreach (IParamGroupView g in target.ParamGroups()) {
                foreach (IParameterView m in g.Members()) {
                    if (m.Handle == 0) {  // a disposed tensor (TorchSharp 0.107.0: IsInvalid): its own state, below
                        disposed++;
                        continue;
                    }
                    memberHandles.Add(m.Handle);
                    if (m.DataPtr != 0) memberData.Add(m.DataPtr);
                    string name = NameOf(m, modelByHandle, modelByData);
                    if (haveKeys && !keys.Contains(m.Handle)) {
                        if (noState.Count == 0) firstMissing = m.Handle;
                        noState.Add(name + " (handle " + m.Handle + ")");
                    }
                    if (!modelByHandle.ContainsKey(m.Handle) && !(m.DataPtr != 0 && modelByData.ContainsKey(m.DataPtr)))
                        stale.Add(name + " (handle " + m.Handle + ")");
                }
            }
            var untracked = new List<string>();
            foreach (IParameterView p in ps) {
                if (p.RequiresGrad && !memberHandles.Contains(p.Handle) && !(p.DataPtr != 0 && memberData.Contains(p.DataPtr)))
                    untracked.Add(p.Name + " (handle " + p.Handle + ")");
            }
            var orphans = new List<string>();
            if (haveKeys) foreach (long k in keyBuf) if (!memberHandles.Contains(k)) orphans.Add(k.ToString());
            var sb = new StringBuilder();
            if (disposed > 0)
                sb.Append(disposed).Append(" optimizer member(s) are disposed tensors (empty handle), the next zero_grad() or step() ")
                  .Append("throws InvalidOperationException (Tensor invalid -- empty handle)").Append('\n');
            // the state the disposed members still own is not orphaned (an approximation without history:
            // the OC103 rule, which has the previous snapshot, still names a real orphan beside them)
            if (orphans.Count <= disposed) orphans.Clear();
            if (noState.Count > 0)
                sb.Append(noState.Count).Append(" optimizer member(s) have no state, the next step() throws KeyNotFoundException for key ")
                  .Append(firstMissing).Append(": ").Append(string.Join(", ", noState.ToArray())).Append('\n');
            if (stale.Count > 0)
                sb.Append(stale.Count).Append(" optimizer member(s) are not the model's tensors (by handle and data), stepped for nothing: ")
                  .Append(string.Join(", ", stale.ToArray())).Append('\n');
            if (untracked.Count > 0)
                sb.Append(untracked.Count).Append(" trainable model parameter(s) in no param group, never trained: ")
                  .Append(string.Join(", ", untracked.ToArray())).Append('\n');
            if (orphans.Count > 0)
                sb.Append(orphans.Count).Append(" optimizer-state key(s) of no member: ").Append(string.Join(", ", orphans.ToArray())).Append('\n');
            return sb.ToString().TrimEnd('\n');
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

        /// <summary>Read everything a snapshot needs. Costs one GradNorm per parameter that has a grad.</summary>
        public ProbeArrays Read()
        {
            var sw = Stopwatch.StartNew();
            var r = new ProbeArrays();
            var notes = new List<string>();
            IList<IParameterView> ps = target.ModelParameters();
            int n = ps.Count;
            r.ParamNames = new string[n]; r.ParamHandles = new long[n]; r.ParamDataPtrs = new long[n];
            r.ParamFlags = new int[n]; r.ParamRanks = new int[n]; r.ParamGradNorms = new double[n];
            r.ParamDTypes = new string[n]; r.ParamDevices = new string[n];
            var shapes = new List<long>();
            var byHandle = new Dictionary<long, string>();
            var byData = new Dictionary<long, string>();
            for (int i = 0; i < n; i++) {
                IParameterView p = ps[i];
                r.ParamNames[i] = p.Name; r.ParamHandles[i] = p.Handle; r.ParamDataPtrs[i] = p.DataPtr;
                r.ParamFlags[i] = Flags(p); r.ParamDTypes[i] = p.DType; r.ParamDevices[i] = p.Device;
                r.ParamGradNorms[i] = p.HasGrad ? p.GradNorm() : double.NaN;
                long[] s = p.Shape ?? new long[0];
                r.ParamRanks[i] = s.Length; shapes.AddRange(s);
                byHandle[p.Handle] = p.Name;
                if (p.DataPtr != 0 && !byData.ContainsKey(p.DataPtr)) byData[p.DataPtr] = p.Name;
            }
            r.ParamShapes = shapes.ToArray();

            IList<IParamGroupView> gs = target.ParamGroups();
            r.GroupSizes = new int[gs.Count]; r.GroupOptionCounts = new int[gs.Count];
            var optNames = new List<string>(); var optValues = new List<double>();
            var mNames = new List<string>(); var mHandles = new List<long>(); var mData = new List<long>();
            var mFlags = new List<int>(); var mRanks = new List<int>(); var mShapes = new List<long>(); var mTypes = new List<string>();
            for (int g = 0; g < gs.Count; g++) {
                string[] on = gs[g].OptionNames ?? new string[0];
                double[] ov = gs[g].OptionValues ?? new double[0];
                int k = Math.Min(on.Length, ov.Length);
                r.GroupOptionCounts[g] = k;
                for (int j = 0; j < k; j++) { optNames.Add(on[j]); optValues.Add(ov[j]); }
                IList<IParameterView> ms = gs[g].Members();
                r.GroupSizes[g] = ms.Count;
                foreach (IParameterView m in ms) {
                    string name = m.Name;
                    if (name == null && !byHandle.TryGetValue(m.Handle, out name) && !(m.DataPtr != 0 && byData.TryGetValue(m.DataPtr, out name)))
                        name = null;
                    mNames.Add(name); mHandles.Add(m.Handle); mData.Add(m.DataPtr); mFlags.Add(Flags(m));
                    long[] s = m.Shape ?? new long[0];
                    mRanks.Add(s.Length); mShapes.AddRange(s); mTypes.Add(m.DType);
                }
            }
            r.GroupOptionNames = optNames.ToArray(); r.GroupOptionValues = optValues.ToArray();
            r.MemberNames = mNames.ToArray(); r.MemberHandles = mHandles.ToArray(); r.MemberDataPtrs = mData.ToArray();
            r.MemberFlags = mFlags.ToArray(); r.MemberRanks = mRanks.ToArray(); r.MemberShapes = mShapes.ToArray();
            r.MemberDTypes = mTypes.ToArray();

            ReadState(r, notes);

            r.OptimizerType = target.OptimizerType;
            if (CollectBeforeMemory) {
                // Tensors dropped without a DisposeScope are freed by finalizers: count what is
                // really alive, not what the GC has not reached yet (docs/memory.md).
                GC.Collect(); GC.WaitForPendingFinalizers(); GC.Collect();
            }
            r.LiveTensors = target.LiveTensors; r.PeakTensors = target.PeakTensors;
            var scopes = target as IDisposeScopeStatistics;
            if (scopes != null) {
                r.CreatedOutsideScope = scopes.TensorsCreatedOutsideScope;
                r.DisposedOutsideScope = scopes.TensorsDisposedOutsideScope;
            }
            r.ManagedBytes = GC.GetTotalMemory(false);
            r.RssBytes = RssBytes();
            r.Notes = notes.ToArray();
            r.ProbeSeconds = sw.Elapsed.TotalSeconds;
            return r;
        }

        void ReadState(ProbeArrays r, List<string> notes)
        {
            var keys = new List<object>(); var values = new List<object>();
            bool ok;
            string why = state.Problem;
            try { ok = state.Entries(keys, values); }
            catch (Exception e) { ok = false; why = "optimizer state not readable: " + e.GetType().FullName + ": " + e.Message; }
            r.StateReadable = ok;
            if (!ok) {
                notes.Add(why ?? "optimizer state not readable: the state field is not enumerable");
                r.StateKeys = new long[0]; r.StateSteps = new long[0]; r.StateTensorCounts = new int[0];
                r.StateTensorNames = new string[0]; r.StateTensorRanks = new int[0]; r.StateTensorShapes = new long[0];
                r.StateTensorDTypes = new string[0];
                return;
            }
            int n = keys.Count;
            r.StateKeys = new long[n]; r.StateSteps = new long[n]; r.StateTensorCounts = new int[n];
            var tn = new List<string>(); var tr = new List<int>(); var tsh = new List<long>(); var tdt = new List<string>();
            for (int i = 0; i < n; i++) {
                r.StateKeys[i] = StateReader.KeyToLong(keys[i]);
                StateView sv = target.DescribeState(keys[i], values[i]) ?? StateReader.Describe(values[i]);
                r.StateSteps[i] = sv.Step;
                r.StateTensorCounts[i] = sv.TensorNames.Count;
                for (int j = 0; j < sv.TensorNames.Count; j++) {
                    tn.Add(sv.TensorNames[j]); tr.Add(sv.TensorShapes[j].Length); tsh.AddRange(sv.TensorShapes[j]); tdt.Add(sv.TensorDTypes[j]);
                }
            }
            r.StateTensorNames = tn.ToArray(); r.StateTensorRanks = tr.ToArray(); r.StateTensorShapes = tsh.ToArray();
            r.StateTensorDTypes = tdt.ToArray();
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
