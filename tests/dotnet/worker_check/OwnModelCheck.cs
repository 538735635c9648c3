// Test harness (tests/unit/test_torchsharp_own_model.py), compiled with mcs together with
// examples/torchsharp-own-model/OwnModel.cs, dotnet/Probe, dotnet/Worker/{TorchSharpProbe,ModuleTrainer}.cs
// and the signature stub tests/dotnet/torchsharp_stub (nothing here touches a tensor: the stub's
// bodies throw). Runs what a user's trainer gets from optcheck without TorchSharp's native code:
// Driver.ForType finding the trainer, ModuleTrainer's checks and faults, and the generic probe
// target's option and state readers over TorchSharp's AdamW / SGD types. One "key value" per line.
using System;
using System.Collections.Generic;
using OptCheck.Contract;
using OptCheck.Probe;
using OptCheck.Worker;
using TorchSharp.Modules;

public sealed class ForgetfulTrainer : ModuleTrainer
{
    protected override void Setup(TrainerOptions o) { }   // sets neither Model nor Optimizer
    public override double Step(long step, long[] x, long[] y, int b, int t) { return 0; }
}

public static class OwnModelCheck
{
    public static int Main(string[] args)
    {
        Driver d = Driver.ForType("OwnModel.OwnTrainer");
        ITrainer t = d.Trainer;
        Console.WriteLine("trainer " + t.GetType().FullName + " : " + t.GetType().BaseType.FullName);
        Console.WriteLine("target " + t.Target.GetType().FullName);
        Console.WriteLine("scenarios " + string.Join(",", t.Scenarios));
        try { t.Lifecycle("eval"); } catch (NotSupportedException e) { Console.WriteLine("lifecycle NotSupportedException " + e.Message); }
        try { t.Inject("param-replaced"); } catch (ArgumentException e) { Console.WriteLine("inject ArgumentException " + e.Message); }
        Console.WriteLine("evalloss " + new ForgetfulTrainer().EvalLoss(new long[0], new long[0], 0, 0));
        try {
            new ForgetfulTrainer().Setup("{}");
        } catch (InvalidOperationException e) {
            Console.WriteLine("forgetful InvalidOperationException " + e.Message);
        }
        try {
            new ForgetfulTrainer().Setup("[\"a\"]");
        } catch (ArgumentException e) {
            Console.WriteLine("badoptions ArgumentException " + e.Message);
        }
        var o = TrainerOptions.FromJson("{\"lr\": 0.003, \"steps\": 2000.0, \"x\": null, \"seed\": \"abc\", " +
                                         "\"extra\": {\"tie\": \"obvious\", \"same_init\": \"a \\\"b\\\"\\u0041\", \"flag\": true}}");
        Console.WriteLine("options " + o.Double("lr", 1) + " " + o.Long("steps", 1) + " " + o.String("x", "absent"));
        try { o.Long("seed", 0); } catch (ArgumentException e) { Console.WriteLine("badlong " + e.Message); }
        Console.WriteLine("extra " + o.String("extra.tie", "") + "|" + o.String("extra.same_init", "") + "|" + o.Bool("extra.flag", false));
        try { TrainerOptions.FromJson("{\"lr\": 0.1,"); } catch (ArgumentException e) { Console.WriteLine("badjson " + e.Message); }
        Console.WriteLine("adamw_options " + string.Join(",", OptionReader.For(typeof(AdamW.Options)).Names));
        Console.WriteLine("no_options " + string.Join(",", OptionReader.For(null).Names));
        StateView sv = t.Target.DescribeState(null, new AdamW.State { step = 42 });
        Console.WriteLine("state step=" + sv.Step + " tensors=" + sv.TensorNames.Count);
        Console.WriteLine("state_field " + (TorchSharpTarget.StateField == null ? "none" : TorchSharpTarget.StateField.DeclaringType.FullName));
        return 0;
    }
}
