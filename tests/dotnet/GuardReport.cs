// The "key value" lines a test harness prints for a PreStepCheckException (tests/dotnet/guard_check/
// WrappedGuardCheck.cs on the stand-in, tests/dotnet/real/GuardLoop.cs on real TorchSharp; the tests read
// them with tests/dotnet/build.py run_harness's format), and for what the unguarded call then threw.
using System;
using System.Linq;
using OptCheck.Contract;

public static class GuardReport
{
    /// <summary>guard_step, guard_call, per problem guard_code / guard_names / guard_key / guard_predicts, guard_message.</summary>
    public static void Print(PreStepCheckException e, long step)
    {
        Console.WriteLine("guard_step " + step);
        Console.WriteLine("guard_call " + e.Call);
        foreach (PreStepProblem p in e.Problems) {
            Console.WriteLine("guard_code " + p.Code);
            Console.WriteLine("guard_names " + p.Code + " " + string.Join(",", p.Names.ToArray()));
            if (p.PredictedKey != null) Console.WriteLine("guard_key " + p.PredictedKey);
            if (p.PredictedException != null) Console.WriteLine("guard_predicts " + p.Code + " " + p.PredictedException);
        }
        Console.WriteLine("guard_message " + e.Message.Split('\n')[0]);
    }

    /// <summary>Runs the call the guard stopped without it: unguarded_threw (nothing, or the exception's type) and
    /// unguarded_message.</summary>
    public static void Unguarded(Action call)
    {
        try {
            call();
            Console.WriteLine("unguarded_threw nothing");
        } catch (Exception u) {
            Console.WriteLine("unguarded_threw " + u.GetType().FullName);
            Console.WriteLine("unguarded_message " + u.Message);
        }
    }
}
