import Foundation

/// Two RSA keys (2,048 bits) made for these tests alone: the local OpenID provider signs with them.
public enum TestRSAKeys {
    public static let key1 = """
        -----BEGIN PRIVATE KEY-----
        MIIEvgIBADANBgkqhkiG9w0BAQEFAASCBKgwggSkAgEAAoIBAQCtgvus74UU7Nh4
        H4re3MrAB+eRXVTzC7WkBylXA2r8Y9XdibvMGloCjxObXCsjOahWSQsNKZrHkNrV
        SavPGOavlEVgK6CfYWQw+X+5sxK2G77FIyjmFQPIsYShYGLcp6S1zn8XfTUuEdMQ
        3tz7HjRH49iu/DVTtMrJBS8r0hQnIYNdKqh7lXEBjUv8fZm/jlLlETR+rIeRlRrY
        Aat+vDtPDp1u7djwGi3WLtHVlj+0bajrRl54K4TYePq072uLf36iCVIJmLe+C1Ry
        4Ce/eeSXeCWgeMFBaihZyTYUhRipPyc6WwfNm9s8mcrdJdEi5drYIGfOdJVlefMS
        WQEaE+ZbAgMBAAECggEAQpLasOBX3g8AAZsMo/TwQBzoT0CRuw1XnL94r5+qmXtO
        0AksSqQjvA6clcQX8xSIz86H1H2NmxursyFor/XccSrBMaSbpPtvv1DDnoMkX0Ym
        /KnAZANVJ9hgzLBYTlRuYKmB3wfV8z64jqUMAbf1lE3KUl2Hsn3QPq/kCPq6a8aQ
        yFoTnmm5C1DdE4gRMLbGtzEaFlg2iEb5Z1A+783V6IdLOxXOibSpJQpvvccB5tlR
        IDyTWIwMKShh68B43z4VNKrGanWszkFcob6E4IKH9k3mZ6f2B8BlC5R/TrFzeHTC
        Nrhv1W9TpHRWuk+Ws6YB/PZ7JoHdFRlHztlg/M6HwQKBgQDWhZ13JbfgDYOGGe0O
        Ufq3tVAf/ExKSfaixt1JiK5A4lvmhdwnqcftZHwWxtTW96dOPuc36GLg3TKLyBBF
        /1w98gXcCkZgq5/emUCmfl6IGrsqi/sAuVCD74+fuQo4dUQpnC5qAMY3X1wOh/Ld
        s44REubCS96IQgRcXg/3BelOQQKBgQDPD3H9dFU/Fuh+Q7fR2GyDSZ18Qbmh96tm
        3Ri7vAbS9yTfqPxrJkpnZhIoNVaHoeFRcvNBFM0on9oAoC0UO50Q3Gbaz1A64dXl
        aN6no/poDzHb1bKeae4m8+djnVOQ9k7nXjjt8bz0wfERVJHXJ85GgVcbw8Nda0+1
        AtFUqTpFmwKBgQChvkqUnC7AUtAY2xFeW7dCrgVEqJDI7m10G6abG9/ucf1CmSj+
        CsgAGGRrM+0kS8OsfkcNYzyyOHU06VpDvJ7K4eFDH8gieSRnzHrvTZZu3mDCWpqc
        2Bx57bUHg5fOK7SB/w0LxZuuAktBdYVLXWc/PlYYpuWZLNVm41D8OkvHQQKBgCDp
        cpP31sj1ajUPrHs1bGId5GNoywncpSjvgcvtYiRMVlcatCyP5Im05rPvbnaWm4rn
        u5SfqtCHQA6TZzbtFtUkQ1EKXNVPKkGRvrpkzRuXNrSbrg2SBuG4KRJjYnILRJVw
        G5purzs0TI4VpCzPzfDVBDSMlFQYB45dCUrsry97AoGBAL15cWYq0l1UcnIFddv5
        oLLE9GWme2ZGz6ZyoByrdsh8B19SfQScnOhqg/GY09Dcw4IHYAwkfNa7hd6DN3dT
        ACWrTS3cd6IP91+aNxOUuPonDA32GEGHHltaeGNLdzIfpFlY/yQVo6QnFGoLfNfk
        ZjTBB+IPI0MUT98iUk0wXRnM
        -----END PRIVATE KEY-----
        """
    public static let key2 = """
        -----BEGIN PRIVATE KEY-----
        MIIEvgIBADANBgkqhkiG9w0BAQEFAASCBKgwggSkAgEAAoIBAQCs3SSs/naK4PD6
        /MSkNHak7vLraCVsxvBBH2Pdp6JJz1dnMQbKpmPx2N1OQWjiVTSu0j2OLNSF+A/B
        6913Ek6pw1OOam/3iZ4KhBdqamZa/J7NnBPHt0x6fjHxZBF63/bTPVDTP9i6ypV/
        bpITgA7v1W4aRGJ5tOwIoI7BMI5W55+TFK8fIP0AdPGa9i6p0LLaA7IGgCgRliLh
        xmMFiY2LGAupXLMKGujljmNE1cQcBeks36dNj/7ssrffJQGaw/SzJ54XCyRQew+K
        /hXY2jpxXS3t4xPQ8AQUp63wo3Of4v2P7LyR4xLbG7HFvnQTRMPYCCI1KXe5BFAx
        WnGG2pCXAgMBAAECggEAB08pmdb/vtlYgdmtY1ehADWt4oHeLCH3+V5J+WQHaSFV
        fam+XY0HH4F0a+FVfY5C/ViANkJXAwpEXL82ohHUi3Lbx9Tuibz4XcUFaHIPS64M
        oA0HNYeJSFEbCNe3QCph8k2JayVIaoSlfoEF8KUkpzWvipTKjEg36eAjqSFUBwCd
        +/bIeJUwrnQ7lBEKGD6uhb++IyoCzsE/FNUNzxK8YfIfRLzxwJQoHogw8oYsidJp
        V7iw+hHBM4JoR4Tj9MWQLzGFcqJrlSzzhf72lqE4CN3rldm9vek0Ybxot3BIxPtj
        /jotzONG5+dD+K8OW24FkpLrw1l4WyDF2rYr7WSeAQKBgQDc3clFuHuSRYbooIyO
        VTUBsO6s/r1kq8Ps6VmFhxPnznEojKrsxrvmvMeFrAGLYxamiZW9Ai5j5BkhoZp2
        V4s9OGpP1I7F0EPSaedSCNGvGeg4YVwa/KR5iVoCfkGk74G7arCdSaUbmKhaxNqq
        xkXv6sEdzXeysR+dLitWfPrDwQKBgQDIXJQLjwR5TDvRRm/fcSd8sF20KfLoMpM4
        vA6D2fhDi0X//9oHM0OZVbUNoYhPDwIZ6oBq4ZFChI0AXOzN88wR0gledqRxV85P
        ieMPLBA48yJuSD9czENIKxI8mlJZoyTvd+PtB9hIbQhvWxpmkllu/bJAYxroHybA
        +pmyNxyKVwKBgQCu9XW6KCCjRzZOUtfk7DR4KXt4SLco5zPmGReUQeOPziYvk/bW
        Z7tzVXnMNuxmSVEpDXYzamXrNUZ/MK/WLRUcovL8WAndQ1RmewQGJPxNc/1TpDQ9
        IIL9z8MglHlVuXCQUTyk7DDBgpViiewaOcQvAEyIWjoGsG61qVwlQA25QQKBgQCB
        P1cw7Z0RMiAUK7/W/4NdZ9fKdJUBPD7EBmvGmkEQMTOCpGTc6DDfJO6aUG1BsojE
        dwVH7SJrKl5asZcAdBhcFoV8rkP96YpovKYAD4iXdB/tzCUzk4CDeWVWOqaMtDUL
        VOdu6/SVI+ChFL+/EwEmG/l0l3mv6whwzDeBQxPiGQKBgDCiOFX/7XhB0sbdUJg8
        igphBl2wBNP0vg7MnjmPearighiQr8md1ohtYXuKcm3CaVvNgf9ADmMSEddZah5n
        6m5ry1AGoCxNo6Rq1aCY9WKSCA5lfn2r5mmogae4gfmRJMGBKZj86BGhMS+EUEWD
        pRret0bEmhud7iCipQ0fIGZ6
        -----END PRIVATE KEY-----
        """
}
