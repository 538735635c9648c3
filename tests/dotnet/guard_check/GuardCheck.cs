// Test harness (tests/integration/test_prestep_guard.py), compiled with mcs against TestLoop.dll
// (the TorchSharp stand-in, tests/dotnet/TestLoop.cs, with dotnet/Probe compiled in): a C# training
// loop that calls PreStepGuard.Check() before every optimizer step, as a C# user without Python
// would. Prints one "key value" line per fact.
//   GuardCheck.exe TRAINER STEPS [FAULT@STEP]
using System;
using System.Collections.Generic;
using System.Globalization;
using OptCheck.Contract;
using OptCheck.Probe;
using OptCheckTest;

public static class GuardCheck
{
    public static int Main(string[] args)
    {
        var trainer = (TestTrainer)Activator.CreateInstance(Type.GetType(args[0] + ", TestLoop", true));
        int steps = int.Parse(args[1], CultureInfo.InvariantCulture);
        string fault = null; long faultAt = -1;
        if (args.Length > 2) {
            string[] f = args[2].Split('@');
            fault = f[0]; faultAt = long.Parse(f[1], CultureInfo.InvariantCulture);
        }
        trainer.Setup("{\"seed\": 1337, \"vocab_size\": 32, \"n_embd\": 8, \"lr\": 0.01}");
        var guard = new PreStepGuard(((ITrainer)trainer).Target);
        const int B = 2, T = 8;
        var x = new long[B * T]; var y = new long[B * T];
        double first = double.NaN, last = double.NaN;
        for (long step = 1; step <= steps; step++) {
            for (int i = 0; i < x.Length; i++) { x[i] = (i + step) % 32; y[i] = (i + step + 1) % 32; }
            if (step == faultAt) Console.WriteLine("injected " + trainer.Inject(fault));
            try {
                guard.Check();
            } catch (PreStepCheckException e) {
                Console.WriteLine("guard_step " + step);
                Console.WriteLine("guard_type " + e.GetType().FullName);
                foreach (string p in e.Lines) Console.WriteLine("guard_problem " + p);
                foreach (PreStepProblem p in e.Problems) Console.WriteLine("guard_code " + p.Code);
                // what the step itself would have thrown without the guard
                try {
                    trainer.Step(step, x, y, B, T);
                    Console.WriteLine("step_threw nothing");
                } catch (KeyNotFoundException k) {
                    Console.WriteLine("step_threw " + k.GetType().FullName + ": " + k.Message);
                }
                return 3;
            }
            last = trainer.Step(step, x, y, B, T);
            if (step == 1) first = last;
        }
        Console.WriteLine("clean " + steps + " steps, loss " + first.ToString("F4", CultureInfo.InvariantCulture) + " -> " +
                          last.ToString("F4", CultureInfo.InvariantCulture));
        Console.WriteLine("full_checks " + guard.FullChecks);
        return 0;
    }
}
