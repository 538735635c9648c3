// Test harness (tests/unit/test_torchsharp_worker_sources.py), compiled with mcs together with
// dotnet/Worker, dotnet/Probe and the signature stub tests/dotnet/torchsharp_stub: runs the parts
// of GptTrainer that touch no tensor — the lr schedule with SoakConfig's defaults, the fault
// list, the optimizer-state field lookup and read — and prints them, one "key value" per line.
using System;
using System.Collections.Generic;
using System.Globalization;
using OptCheck.Contract;
using OptCheck.Probe;
using OptCheck.Worker;
using TorchSharp.Modules;
using TorchSharp.Utils;

/// <summary>An object holding an OptimizerHelper._state-shaped dictionary in a non-public field, as the optimizer does.</summary>
public sealed class StateBox
{
    #pragma warning disable 414
    readonly object _state;
    #pragma warning restore 414
    public StateBox(object state) { _state = state; }
}

public static class LrCheck
{
    public static int Main(string[] args)
    {
        var t = new GptTrainer();
        foreach (string a in args) {
            long step = long.Parse(a, CultureInfo.InvariantCulture);
            Console.WriteLine("lr " + step + " " + t.LrAt(step).ToString("R", CultureInfo.InvariantCulture));
        }
        Console.WriteLine("scenarios " + string.Join(",", t.Scenarios));
        Console.WriteLine("state_field " + (TorchSharpTarget.StateField == null ? "none" : TorchSharpTarget.StateField.DeclaringType.FullName + "." + TorchSharpTarget.StateField.Name));
        IProbeTarget target = t.Target;  // the probe reads TorchSharpTarget through the internal IProbeTarget
        Console.WriteLine("state_owner " + (target.StateOwner == null ? "none" : target.StateOwner.GetType().FullName) + " " + target.StateFieldName);
        Console.WriteLine("base " + t.GetType().BaseType.FullName + " guarded " + (t is IGuardedTrainer));
        // the probe's read of an OptimizerHelper._state-shaped dictionary (the stub's OrderedDict has
        // TorchSharp's enumerators: the non-generic one throws)
        var dict = new OrderedDict<IntPtr, OptimizerState>();
        dict[new IntPtr(42)] = new AdamW.State { step = 7 };
        dict[new IntPtr(41)] = new AdamW.State { step = 8 };
        var reader = new StateReader(new StateBox(dict), "_state");
        var keys = new List<object>(); var values = new List<object>(); var handles = new List<long>();
        bool ok = reader.Entries(keys, values) && reader.Keys(handles);
        var steps = new List<string>();
        foreach (object v in values) steps.Add(target.DescribeState(null, v).Step.ToString(CultureInfo.InvariantCulture));
        Console.WriteLine("state_read " + ok + " " + string.Join(",", handles) + " " + string.Join(",", steps));
        return 0;
    }
}
