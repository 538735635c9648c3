// Test harness (tests/unit/test_torchsharp_native_optimizer.py): compiled with mcs against TorchSharp
// 0.107.0's own reference assembly together with dotnet/Probe, Worker/TorchSharpProbe.cs and
// Worker/ModuleTrainer.cs, and run on Mono. Nothing here reaches TorchSharp's native code.
//
// FakeNative stands in for torch.optim.LBFGS: a torch.optim.Optimizer with a native handle (its
// internal HType, here one that does not own its address, so nothing is ever freed), not an
// OptimizerHelper, whose ParamGroup.Parameters and parameters() count every enumeration: on real
// TorchSharp each enumeration wraps the optimizer's native tensors in new Parameters that free them
// when finalized ("double free or corruption", run on 0.107.0). The probe must read its groups'
// options, report members and state as not readable, judge nothing from them, and never enumerate
// them. Prints one "key value" line per fact.
using System;
using System.Collections.Generic;
using System.Reflection;
using System.Runtime.InteropServices;
using OptCheck.Contract;
using OptCheck.Probe;
using OptCheck.Worker;
using TorchSharp;
using TorchSharp.Modules;
using static TorchSharp.torch;

public sealed class FakeNative : optim.Optimizer
{
    public int Enumerations, Steps, ZeroGrads;
    public readonly SafeHandle Native;
    readonly ParamGroup[] groups;

    public FakeNative() : base(IntPtr.Zero)
    {
        FieldInfo f = typeof(optim.Optimizer).GetField("handle", BindingFlags.Instance | BindingFlags.NonPublic | BindingFlags.Public);
        Native = (SafeHandle)Activator.CreateInstance(f.FieldType, BindingFlags.Instance | BindingFlags.NonPublic | BindingFlags.Public,
                                                      null, new object[] { new IntPtr(0x5eed), false }, null);
        f.SetValue(this, Native);
        var g = new ParamGroup();
        g.Parameters = Counted();
        g.Options = new OptimizerOptions { LearningRate = 0.25, InitialLearningRate = 0.25 };
        groups = new[] { g };
    }

    IEnumerable<Parameter> Counted()
    {
        Enumerations++;   // runs only when enumerated
        yield break;
    }

    public override IEnumerable<optim.ILearningRateController> ParamGroups { get { return groups; } }
    public override IEnumerable<Parameter> parameters() { Enumerations++; return new Parameter[0]; }
    public override void zero_grad() { ZeroGrads++; }
    public override Tensor step(Func<Tensor> closure = null) { Steps++; return null; }
}

public sealed class NativeTrainer : ModuleTrainer
{
    public FakeNative Fake;
    protected override void Setup(TrainerOptions o) { Optimizer = Fake = new FakeNative(); }
    /// <summary>Setup without a Model (ModuleTrainer.Setup(string) requires one; a Module needs the native library).</summary>
    public void Build() { Setup(TrainerOptions.FromJson("{}")); }
    public override double Step(long step, long[] x, long[] y, int b, int t) { Optimizer.zero_grad(); Optimizer.step(); return 0; }
}

/// <summary>TorchSharpTarget's optimizer side, with a model of no parameters (a Module needs the native library).</summary>
sealed class NoModel : IProbeTarget, IProbeNotes
{
    readonly IProbeTarget t;
    public NoModel(IProbeTarget t) { this.t = t; }
    public IList<IParameterView> ModelParameters() { return new List<IParameterView>(); }
    public IList<IParamGroupView> ParamGroups() { return t.ParamGroups(); }
    public object StateOwner { get { return t.StateOwner; } }
    public string StateFieldName { get { return t.StateFieldName; } }
    public StateView DescribeState(object key, object value) { return t.DescribeState(key, value); }
    public string OptimizerType { get { return t.OptimizerType; } }
    public long LiveTensors { get { return -1; } }
    public long PeakTensors { get { return -1; } }
    public IList<string> Notes { get { return ((IProbeNotes)t).Notes; } }
}

public static class NativeOptimizerCheck
{
    public static int Main(string[] args)
    {
        var trainer = new NativeTrainer();
        trainer.Build();
        FakeNative fake = trainer.Fake;
        Console.WriteLine("wrapped " + trainer.Optimizer.GetType().Name + " " + ReferenceEquals(trainer.UnguardedOptimizer, fake));
        Console.WriteLine("native " + TorchSharpTarget.IsNative(fake) + " " + TorchSharpTarget.IsNative(trainer.Optimizer));
        IProbeTarget target = trainer.Target;
        IList<IParamGroupView> gs = target.ParamGroups();
        Console.WriteLine("groups " + gs.Count + " lr " + gs[0].OptionValues[0] + " members " + (gs[0].Members() == null ? "unreadable" : "read"));
        Console.WriteLine("state_owner " + (target.StateOwner == null ? "none" : target.StateOwner.GetType().Name));
        Console.WriteLine("note " + ((IProbeNotes)target).Notes[0]);
        var core = new ProbeCore(new NoModel(target));
        Console.WriteLine("problems " + core.PreStepProblems().Count);
        long fp1 = core.Fingerprint(), fp2 = core.Fingerprint();
        Console.WriteLine("fingerprint_stable " + (fp1 == fp2));
        Console.WriteLine("body " + core.Read());
        // a GuardedOptimizer runs its check, then the native optimizer's own call, and forwards the rest
        var seen = new List<string>();
        var wrapped = GuardedOptimizer.Over(fake, call => seen.Add(call));
        wrapped.zero_grad(); wrapped.step(); wrapped.step(() => null);
        int groupsSeen = 0;
        foreach (var g in wrapped.ParamGroups) groupsSeen++;
        Console.WriteLine("forwarded " + string.Join(",", seen.ToArray()) + " zero_grad=" + fake.ZeroGrads + " step=" + fake.Steps +
                          " groups=" + groupsSeen + " unwrap=" + ReferenceEquals(GuardedOptimizer.Unwrap(GuardedOptimizer.Over(wrapped, c => { })), fake));
        // under optcheck (recording) a check that cannot read the target never raises into the user's step
        var guard = ((IGuardedTrainer)trainer).Guard;
        guard.Recording = true;
        trainer.Step(1, new long[0], new long[0], 0, 0);
        Console.WriteLine("recording_step zero_grad=" + fake.ZeroGrads + " step=" + fake.Steps + " error=" + guard.LastError);
        GC.Collect(); GC.WaitForPendingFinalizers(); GC.Collect();
        Console.WriteLine("enumerations " + fake.Enumerations);
        Console.WriteLine("handle " + fake.Native.DangerousGetHandle().ToInt64().ToString("x") + " closed=" + fake.Native.IsClosed +
                          " invalid=" + fake.Native.IsInvalid);
        return 0;
    }
}
