#include "gdnTestDoubles.h"

using namespace nvinfer1;

namespace gdn
{
namespace testing
{
namespace
{
bool apply(DimensionOperation op, int64_t x, int64_t y, int64_t& out)
{
    switch (op)
    {
    case DimensionOperation::kSUM: out = x + y; return true;
    case DimensionOperation::kPROD: out = x * y; return true;
    case DimensionOperation::kMAX: out = x > y ? x : y; return true;
    case DimensionOperation::kMIN: out = x < y ? x : y; return true;
    case DimensionOperation::kSUB: out = x - y; return true;
    case DimensionOperation::kEQUAL: out = x == y ? 1 : 0; return true;
    case DimensionOperation::kLESS: out = x < y ? 1 : 0; return true;
    case DimensionOperation::kFLOOR_DIV:
        if (y == 0)
        {
            return false;
        }
        out = x / y - ((x % y != 0 && ((x < 0) != (y < 0))) ? 1 : 0);
        return true;
    case DimensionOperation::kCEIL_DIV:
        if (y == 0)
        {
            return false;
        }
        out = x / y + ((x % y != 0 && ((x < 0) == (y < 0))) ? 1 : 0);
        return true;
    }
    return false;
}
} // namespace

bool SymbolicExpr::evaluate(std::map<std::string, int64_t> const& sizes, int64_t& out) const
{
    if (node.a != nullptr)
    {
        int64_t x = 0;
        int64_t y = 0;
        return node.a->evaluate(sizes, x) && node.b->evaluate(sizes, y) && apply(node.op, x, y, out);
    }
    if (node.symbol.empty())
    {
        out = node.value;
        return true;
    }
    auto it = sizes.find(node.symbol);
    if (it == sizes.end())
    {
        return false;
    }
    out = it->second + node.value;
    return true;
}

SymbolicExpr* SymbolicExprBuilderImpl::make()
{
    mPool.emplace_back(new SymbolicExpr());
    return mPool.back().get();
}

IDimensionExpr const* SymbolicExprBuilderImpl::constant(int64_t value)
{
    SymbolicExpr* e = make();
    e->node.value = value;
    return e;
}

SymbolicExpr const* SymbolicExprBuilderImpl::symbol(std::string const& name, int64_t offset)
{
    SymbolicExpr* e = make();
    e->node.symbol = name;
    e->node.value = offset;
    return e;
}

IDimensionExpr const* SymbolicExprBuilderImpl::operation(
    DimensionOperation op, IDimensionExpr const& first, IDimensionExpr const& second)
{
    // Every expression a plugin sees comes from this builder.
    auto const& a = static_cast<SymbolicExpr const&>(first);
    auto const& b = static_cast<SymbolicExpr const&>(second);
    if (a.isConstant() && b.isConstant())
    {
        int64_t v = 0;
        return apply(op, a.getConstantValue(), b.getConstantValue(), v) ? constant(v) : nullptr;
    }
    SymbolicExpr* e = make();
    e->node.op = op;
    e->node.a = &a;
    e->node.b = &b;
    return e;
}

DimsExprs SymbolicExprBuilder::constants(Dims const& d)
{
    DimsExprs e{};
    e.nbDims = d.nbDims;
    for (int32_t i = 0; i < d.nbDims; ++i)
    {
        e.d[i] = constant(d.d[i]);
    }
    return e;
}

int64_t evaluate(IDimensionExpr const* e, std::map<std::string, int64_t> const& sizes)
{
    int64_t v = 0;
    if (e == nullptr || !static_cast<SymbolicExpr const*>(e)->evaluate(sizes, v))
    {
        return INT64_MIN;
    }
    return v;
}

} // namespace testing
} // namespace gdn
